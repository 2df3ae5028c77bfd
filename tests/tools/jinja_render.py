#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Render a chat template as Hugging Face transformers does (the reference for shardlm's renderers).
   jinja_render.py TEMPLATE.jinja BOS EOS < request.json
   request: {"messages": [...], "add_generation_prompt": bool (default true),
             "chat_template_kwargs": {extra template variables, as vLLM and llama.cpp pass them}}
   Exit 0 with exactly the rendered bytes (UTF-8) on stdout; exit 1 with one stderr line
   "jinja_render.py: MESSAGE" when the template calls raise_exception(MESSAGE); exit 2 with one line
   "jinja_render.py: TYPE: MESSAGE" for any other error (a malformed request, an undefined value, a type error)."""
import datetime, json, sys
import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols

class RaisedException(jinja2.exceptions.TemplateError):
    pass

def raise_exception(msg):
    raise RaisedException(msg)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def fail(rc, msg):
    sys.stderr.write("jinja_render.py: " + " ".join(msg.splitlines()) + "\n")
    sys.exit(rc)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
try:
    req = json.load(sys.stdin.buffer)
    # messages, add_generation_prompt and the two tokens win over chat_template_kwargs of the same name
    variables = dict(req.get("chat_template_kwargs") or {})
    variables.update(messages=req["messages"], add_generation_prompt=req.get("add_generation_prompt", True),
                     bos_token=sys.argv[2], eos_token=sys.argv[3])
    t = env.from_string(open(sys.argv[1], encoding="utf-8").read())
    out = t.render(**variables).encode("utf-8")
except RaisedException as e:
    fail(1, str(e))
except Exception as e:
    fail(2, type(e).__name__ + ": " + str(e))
sys.stdout.buffer.write(out)
