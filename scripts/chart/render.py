"""Render charts/aether offline with Helm's own engine (PyPI helm-python-sdk, which embeds
Helm's Go SDK as a shared library: no helm binary, no cluster).

    render.py CHART VALUES.yaml OUT.yaml [--release aether] [--namespace aether-system]

Writes every rendered template as one multi-document YAML stream (ordered by template path,
each preceded by `# Source: <path>` as `helm template` prints it) and NOTES.txt beside it as
OUT.notes.txt. The values are checked against values.schema.json first. A CA the chart
generates (random on every render) is checked to be a PEM certificate and key, then written
as a fixed placeholder so that the output can be compared with a golden file.
"""

import argparse
import base64
import pathlib
import sys

import helm_python as helm
import yaml

PLACEHOLDER = "<generated at install: checked to be PEM>"


def normalize_generated_ca(doc_text):
    """Replace the data of a Secret the chart generated (a new CA each render)."""
    doc = yaml.safe_load(doc_text)
    if not (isinstance(doc, dict) and doc.get("kind") == "Secret"):
        return doc_text
    data = doc.get("data") or {}
    cert = base64.b64decode(data.get("ca.crt", ""), validate=True).decode()
    key = base64.b64decode(data.get("ca.key", ""), validate=True).decode()
    if not cert.startswith("-----BEGIN CERTIFICATE-----"):
        raise SystemExit(f"the CA Secret's ca.crt is not a PEM certificate: {cert[:40]!r}")
    if "PRIVATE KEY-----" not in key.splitlines()[0]:
        raise SystemExit(f"the CA Secret's ca.key is not a PEM private key: {key[:40]!r}")
    lines = []
    for line in doc_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("ca.crt:") or stripped.startswith("ca.key:"):
            indent = line[: len(line) - len(line.lstrip())]
            line = f"{indent}{stripped.split(':')[0]}: {PLACEHOLDER!r}".replace("'", '"')
        lines.append(line)
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("chart")
    ap.add_argument("values")
    ap.add_argument("out")
    ap.add_argument("--release", default="aether")
    ap.add_argument("--namespace", default="aether-system")
    args = ap.parse_args()

    values = yaml.safe_load(pathlib.Path(args.values).read_text()) or {}
    with helm.Chart.load(args.chart) as chart:
        try:
            chart.validate_schema(values)
            rendered = chart.render(
                values, name=args.release, namespace=args.namespace, is_install=True
            )
        except helm.HelmError as e:
            print(f"{args.values}: {e}", file=sys.stderr)
            return 1
    docs = []
    notes = ""
    for path in sorted(rendered):
        text = rendered[path]
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        if not path.endswith((".yaml", ".yml")):
            continue
        for part in text.split("\n---\n"):
            if not part.strip() or not yaml.safe_load(part):
                continue  # a template that renders nothing (a disabled object)
            body = normalize_generated_ca(part.strip("\n") + "\n")
            docs.append(f"---\n# Source: {path}\n{body}")
    out = pathlib.Path(args.out)
    out.write_text("".join(docs))
    out.with_suffix(".notes.txt").write_text(notes.rstrip("\n") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
