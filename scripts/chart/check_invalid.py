"""Every case of charts/aether/tests/invalid-values.yaml must be refused (scripts/check-chart):
`stage: schema` (the default) by values.schema.json, `stage: render` by a template's own check,
each with an error naming `expect`. Prints one line per case; exits 1 if any was accepted."""

import pathlib
import sys

import helm_python as helm
import yaml


def main():
    chart_dir = sys.argv[1]
    cases = yaml.safe_load(pathlib.Path(chart_dir, "tests/invalid-values.yaml").read_text())
    bad = 0
    with helm.Chart.load(chart_dir) as chart:
        for case in cases:
            stage = case.get("stage", "schema")
            error = None
            by = None
            try:
                by = "schema"
                chart.validate_schema(case["values"])
                by = "render"
                chart.render(case["values"], name="aether", namespace="aether-system",
                             is_install=True)
            except (helm.HelmValuesError, helm.HelmRenderError) as e:
                error = " ".join(str(e).split())
            if error is None:
                print(f"FAIL accepted: {case['name']}: {case['values']}")
                bad += 1
            elif case["expect"] not in error:
                print(f"FAIL refused, but not for {case['expect']!r}: {case['name']}: {error}")
                bad += 1
            elif by != stage:
                print(f"FAIL refused by the {by}, not the {stage}: {case['name']}: {error}")
                bad += 1
            else:
                print(f"ok   refused by the {stage}: {case['name']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
