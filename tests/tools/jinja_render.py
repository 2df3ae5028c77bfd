#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Render a chat template as Hugging Face transformers does (the reference for shardlm's renderers).
   jinja_render.py TEMPLATE.jinja BOS EOS < request.json
   request: {"messages": [...], "add_generation_prompt": bool (default true),
             "chat_template_kwargs": {extra template variables, as vLLM and llama.cpp pass them}}
   Exit 0 with exactly the rendered bytes (UTF-8) on stdout; exit 1 with one stderr line
   "jinja_render.py: MESSAGE" when the template calls raise_exception(MESSAGE); exit 2 with one line
   "jinja_render.py: TYPE: MESSAGE" for any other error (a malformed request, an undefined value, a type error).
   jinja_render.py --batch PAIRS OUTDIR BOS EOS
   renders every pair "TEMPLATE.jinja\0request.json\0" of PAIRS in one process (a test's hundreds of
   renderings without a Python start each): the Nth pair's stdout, stderr line and exit code as above
   go to OUTDIR/N.out, N.err and N.rc (N from 1); a PAIRS file not made of whole pairs is refused."""
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

def render(template_path, request, bos, eos):
    """(exit code, rendered bytes, stderr line) of one rendering, as the command line reports it."""
    try:
        req = json.loads(request)
        # messages, add_generation_prompt and the two tokens win over chat_template_kwargs of the same name
        variables = dict(req.get("chat_template_kwargs") or {})
        variables.update(messages=req["messages"], add_generation_prompt=req.get("add_generation_prompt", True),
                         bos_token=bos, eos_token=eos)
        t = env.from_string(open(template_path, encoding="utf-8").read())
        return 0, t.render(**variables).encode("utf-8"), ""
    except RaisedException as e:
        return 1, b"", line(str(e))
    except Exception as e:
        return 2, b"", line(type(e).__name__ + ": " + str(e))

def line(msg):
    return "jinja_render.py: " + " ".join(msg.splitlines()) + "\n"

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
if len(sys.argv) == 6 and sys.argv[1] == "--batch":
    outdir, bos, eos = sys.argv[3], sys.argv[4], sys.argv[5]
    with open(sys.argv[2], "rb") as f:
        data = f.read()
    names = data.split(b"\0")[:-1]  # NUL-terminated: any byte of a path but NUL goes
    if not data.endswith(b"\0") or len(names) % 2:
        sys.stderr.write("jinja_render.py: %s: not NUL-terminated TEMPLATE, REQUEST pairs\n" % sys.argv[2])
        sys.exit(2)
    for n, (template_path, request_path) in enumerate(zip(names[0::2], names[1::2]), 1):
        with open(request_path, "rb") as f:
            rc, out, err = render(template_path, f.read(), bos, eos)
        for ext, blob in (("out", out), ("err", err.encode("utf-8")), ("rc", b"%d\n" % rc)):
            with open("%s/%d.%s" % (outdir, n, ext), "wb") as f:
                f.write(blob)
    sys.exit(0)
if len(sys.argv) != 4:
    sys.stderr.write("usage: jinja_render.py TEMPLATE.jinja BOS EOS < request.json\n"
                     "       jinja_render.py --batch PAIRS OUTDIR BOS EOS\n")
    sys.exit(2)
rc, out, err = render(sys.argv[1], sys.stdin.buffer.read(), sys.argv[2], sys.argv[3])
sys.stderr.write(err)
sys.stdout.buffer.write(out)
sys.exit(rc)
