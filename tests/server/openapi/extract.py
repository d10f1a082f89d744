#!/usr/bin/env python3
# Usage: extract.py openapi.json openai-subset.json COMMIT (openapi.json from github.com/openai/openai-openapi).
# Writes the part of OpenAI's published OpenAPI document (openai/openai-openapi, openapi.json)
# that the server tests validate against: the named schemas and everything they reference, as
# one JSON Schema 2020-12 document with the component schemas under $defs.
import json, sys

ROOTS = ["CreateCompletionResponse", "CreateChatCompletionResponse", "CreateChatCompletionStreamResponse",
         "Response", "ResponseStreamEvent", "ErrorResponse", "ListModelsResponse", "Model"]

def main(src, dst, commit):
    schemas = json.load(open(src))["components"]["schemas"]
    keep, todo = {}, list(ROOTS)
    def refs(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "$ref" and isinstance(v, str):
                    yield v.rsplit("/", 1)[-1]
                else:
                    yield from refs(v)
        elif isinstance(node, list):
            for v in node:
                yield from refs(v)
    while todo:
        name = todo.pop()
        if name in keep: continue
        keep[name] = schemas[name]
        todo.extend(refs(keep[name]))
    def strip(node):  # descriptions, examples and x- extensions say nothing a validator reads
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items()
                    if not (k.startswith("x-") or k in ("example", "examples") or
                            (k in ("description", "title") and isinstance(v, str)))}
        return [strip(v) for v in node] if isinstance(node, list) else node
    # 2019-09's $recursiveRef "#" (CompoundFilter) is 2020-12's plain $ref to the schema itself.
    def unrecurse(node, name):
        if isinstance(node, dict):
            return {("$ref" if k == "$recursiveRef" else k):
                    (f"#/components/schemas/{name}" if k == "$recursiveRef" else unrecurse(v, name))
                    for k, v in node.items() if k != "$recursiveAnchor"}
        return [unrecurse(v, name) for v in node] if isinstance(node, list) else node
    keep = {k: unrecurse(strip(v), k) for k, v in keep.items()}
    text = json.dumps({"$schema": "https://json-schema.org/draft/2020-12/schema",
                       "$id": "https://peregrine.test/openai-openapi-subset.json",
                       "description": f"Component schemas of openai/openai-openapi {commit} (openapi.json) "
                                      "reachable from " + ", ".join(ROOTS) + "; written by tests/server/openapi/extract.py.",
                       "$defs": dict(sorted(keep.items()))}, indent=1)
    open(dst, "w").write(text.replace('"#/components/schemas/', '"#/$defs/') + "\n")
    print(len(keep), "schemas")

main(*sys.argv[1:])
