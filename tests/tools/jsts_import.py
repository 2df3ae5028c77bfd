#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The official JSON-Schema-Test-Suite's cases, in MaskBench's format, for the grammar engine.

    jsts_import.py SUITE_CHECKOUT OUT_DIR

Reads SUITE_CHECKOUT/tests/draft2020-12/ (the keywords the engine compiles or refuses by name,
and the optional format files of the formats it asserts) and writes one file per test group,
OUT_DIR/draft2020-12--<file>--<NN>.json: {"description", "schema", "tests": [{"description",
"valid", "data"}]} - the file `shardlm bench grammar --data` and test_grammar read. The suite is
MIT-licensed (Julian Berman); its LICENSE goes beside the files.
"""
import json
import os
import sys

KEYWORDS = [
    "additionalProperties", "allOf", "anyOf", "boolean_schema", "const", "default", "defs",
    "enum", "exclusiveMaximum", "exclusiveMinimum", "infinite-loop-detection", "items",
    "maxItems", "maxLength", "maxProperties", "maximum", "minItems", "minLength",
    "minProperties", "minimum", "not", "oneOf", "pattern", "patternProperties", "prefixItems",
    "properties", "propertyNames", "ref", "required", "type",
]
FORMATS = ["date", "date-time", "email", "ipv4", "time", "uuid"]


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: jsts_import.py SUITE_CHECKOUT OUT_DIR")
    suite, out = sys.argv[1], sys.argv[2]
    base = os.path.join(suite, "tests", "draft2020-12")
    os.makedirs(out, exist_ok=True)
    files = [(k, os.path.join(base, k + ".json")) for k in KEYWORDS]
    files += [("format-" + f, os.path.join(base, "optional", "format", f + ".json"))
              for f in FORMATS]
    n = 0
    for name, path in files:
        with open(path, encoding="utf-8") as fp:
            groups = json.load(fp)
        for i, g in enumerate(groups):
            case = {"description": g["description"], "schema": g["schema"],
                    "tests": [{"description": t["description"], "valid": t["valid"],
                               "data": t["data"]} for t in g["tests"]]}
            with open(os.path.join(out, f"draft2020-12--{name}--{i:02d}.json"), "w",
                      encoding="utf-8") as fp:
                json.dump(case, fp, ensure_ascii=False, separators=(",", ":"))
                fp.write("\n")
            n += 1
    with open(os.path.join(suite, "LICENSE"), encoding="utf-8") as src, \
            open(os.path.join(out, "LICENSE"), "w", encoding="utf-8") as dst:
        dst.write(src.read())
    print(f"jsts_import: {n} test groups into {out}")


if __name__ == "__main__":
    main()
