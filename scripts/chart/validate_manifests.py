"""Validates Kubernetes manifests offline (scripts/check-chart).

    validate_manifests.py --version 1.33 --crd CRD.yaml... -- FILE...

Every document of every FILE must be one of:
- a kind of Kubernetes itself: checked with PyPI kubernetes-validate, strict (an unknown
  field is an error), against the schemas of the version given;
- a kind one of the --crd files defines (MeshFilter): checked against the CRD's
  openAPIV3Schema with jsonschema, unknown fields refused as the API server prunes them
  (CEL rules, x-kubernetes-validations, are not run here: the kind suite's admission does);
- a Gateway API kind or a Prometheus Operator kind: left to their npm models
  (validate-npm-models.mjs), counted here.
Any other kind, or a document that does not parse, fails: nothing passes unchecked.

With --expect-invalid every object must be refused instead; one annotated
`test.aether.io/refused-at: <field>` (charts/aether/tests/invalid-meshfilters.yaml) must be refused
there and nowhere else. jsonschema runs Python's `re`, whose `$` also matches before a final
newline where the API server's Go regexp does not: a value ending in a newline can pass here and
be refused there (the converter's unit tests hold the patterns to Rust's regex, which agrees with
Go's on them).
"""

import argparse
import sys

import jsonschema
import kubernetes_validate
import yaml

# The groups validate-npm-models.mjs checks.
NPM_GROUPS = ("gateway.networking.k8s.io", "monitoring.coreos.com")


def crd_schemas(paths):
    """(apiVersion, kind) -> the openAPIV3Schema of that version, from CRD manifests."""
    schemas = {}
    for path in paths:
        for crd in yaml.safe_load_all(open(path)):
            if not crd:
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for v in crd["spec"]["versions"]:
                schemas[(f"{group}/{v['name']}", kind)] = v["schema"]["openAPIV3Schema"]
    return schemas


def structural(schema):
    """A CRD's structural schema as jsonschema: objects with properties refuse other fields
    (the API server would prune them: a typo would be dropped unsaid)."""
    if not isinstance(schema, dict):
        return schema
    out = {k: structural(v) if isinstance(v, (dict, list)) else v for k, v in schema.items()
           if not k.startswith("x-kubernetes-")}
    for key in ("properties",):
        if key in out:
            out[key] = {k: structural(v) for k, v in out[key].items()}
    if "items" in out:
        out["items"] = structural(out["items"])
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = structural(out["additionalProperties"])
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


REFUSED_AT = "test.aether.io/refused-at"


def location(error):
    """Where a jsonschema error is, spelt as the daemon's converter spells a field
    (`spec.targetRefs[0].name`): a missing or unknown field is named itself, not its object."""
    where = ""
    for part in error.absolute_path:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else part)
    named = []
    if error.validator == "required" and isinstance(error.instance, dict):
        named = [p for p in error.validator_value if p not in error.instance]
    elif error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = error.schema.get("properties", {})
        named = [p for p in error.instance if p not in known]
    if len(named) == 1:
        where = f"{where}.{named[0]}" if where else named[0]
    return where


def errors_of(doc, version, crds):
    """Every error of one object as (location, message); empty when it is valid."""
    api, kind = doc.get("apiVersion", ""), doc.get("kind", "")
    if (api, kind) in crds:
        body = {k: v for k, v in doc.items() if k != "status"}
        errors = sorted(jsonschema.Draft7Validator(structural(crds[(api, kind)])).iter_errors(body),
                        key=str)
        return [(location(e), e.message) for e in errors]
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return [("", f"no schema for {api} {kind}")]
    except kubernetes_validate.ValidationError as e:
        return [("/".join(map(str, e.path)), e.message)]
    return []


def under(where, field):
    """Whether `where` is `field` or inside it."""
    return where == field or where.startswith(field + ".") or where.startswith(field + "[")


def expect_invalid(args):
    """Every object must be refused; one annotated with test.aether.io/refused-at only there:
    every error at or under that field, so that a case refused for another reason fails."""
    crds = crd_schemas(args.crd)
    bad = 0
    for path in args.files:
        for doc in (d for d in yaml.safe_load_all(open(path)) if d):
            name = f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}"
            field = ((doc.get("metadata") or {}).get("annotations") or {}).get(REFUSED_AT)
            errors = errors_of(doc, args.version, crds)
            elsewhere = [e for e in errors if field is not None and not under(e[0], field)]
            if not errors:
                print(f"FAIL {path}: {name}: accepted, but must be refused")
                bad += 1
            elif elsewhere:
                print(f"FAIL {path}: {name}: refused at {elsewhere[0][0] or '/'}, not only at "
                      f"{field}: {elsewhere[0][1][:90]}")
                bad += 1
            else:
                where = f" at {field}" if field is not None else ""
                print(f"ok   {path}: {name}: refused{where} ({errors[0][1][:90]})")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", required=True)
    ap.add_argument("--crd", action="append", default=[])
    ap.add_argument("--expect-invalid", action="store_true",
                    help="every object must fail instead (the check that the check can fail)")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    if args.expect_invalid:
        return expect_invalid(args)
    crds = crd_schemas(args.crd)
    checked = {"kubernetes": 0, "crd": 0, "npm models (elsewhere)": 0}
    failed = 0
    for path in args.files:
        try:
            docs = [d for d in yaml.safe_load_all(open(path)) if d]
        except yaml.YAMLError as e:
            print(f"FAIL {path}: not YAML: {e}")
            failed += 1
            continue
        for doc in docs:
            api, kind = doc.get("apiVersion", ""), doc.get("kind", "")
            name = f"{path}: {kind} {doc.get('metadata', {}).get('namespace', '')}/" \
                   f"{doc.get('metadata', {}).get('name', '')}"
            if api.split("/")[0] in NPM_GROUPS:
                checked["npm models (elsewhere)"] += 1
                continue
            if (api, kind) in crds:
                body = {k: v for k, v in doc.items() if k != "status"}
                errors = sorted(jsonschema.Draft7Validator(structural(crds[(api, kind)]))
                                .iter_errors(body), key=str)
                if errors:
                    print(f"FAIL {name}: {errors[0].message} at /{'/'.join(map(str, errors[0].path))}")
                    failed += 1
                else:
                    checked["crd"] += 1
                continue
            try:
                kubernetes_validate.validate(doc, args.version, strict=True)
                checked["kubernetes"] += 1
            except kubernetes_validate.SchemaNotFoundError:
                print(f"FAIL {name}: no schema for {api} {kind} (Kubernetes {args.version}, or --crd)")
                failed += 1
            except kubernetes_validate.ValidationError as e:
                where = "/".join(map(str, e.path))
                print(f"FAIL {name}: {e.message} at /{where}")
                failed += 1
    total = sum(checked.values())
    print(f"{len(args.files)} files, {total} objects: " +
          ", ".join(f"{n} {k}" for k, n in checked.items()) + f"; {failed} failed")
    if total == 0:
        print("FAIL no object found")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
