// Validates every object of a group that has an npm model package (the Gateway API's routes,
// the Prometheus Operator's PodMonitor) in the YAML files given (or found under the directories
// given) against that package's schemas (scripts/check-chart). Exits 1 when an object fails,
// when its kind or version has no model, or when no such object was found at all.
//
//   node validate-npm-models.mjs [--expect-invalid] PATH...
//
// With --expect-invalid every object must fail instead (the check that the check can fail).
import { readFileSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { parseAllDocuments } from "yaml";

// The API groups checked here, each with the npm package of its models (package.json).
const PACKAGES = {
  "gateway.networking.k8s.io": "@kubernetes-models/gateway-api",
  "monitoring.coreos.com": "@kubernetes-models/prometheus-operator",
};

const args = process.argv.slice(2);
const expectInvalid = args[0] === "--expect-invalid";
const paths = expectInvalid ? args.slice(1) : args;

function yamlFiles(path) {
  if (statSync(path).isDirectory()) {
    return readdirSync(path).sort().flatMap((name) => yamlFiles(join(path, name)));
  }
  return /\.ya?ml$/.test(path) ? [path] : [];
}

let checked = 0;
let failed = 0;
for (const file of paths.flatMap(yamlFiles)) {
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    if (doc.errors.length > 0) {
      console.log(`FAIL ${file}: not YAML: ${doc.errors[0].message}`);
      failed++;
      continue;
    }
    const obj = doc.toJS();
    const apiVersion = obj?.apiVersion ?? "";
    const [group, version] = apiVersion.split("/");
    const pkg = PACKAGES[group];
    if (pkg === undefined) continue;
    const what = `${file}: ${obj.kind} ${obj.metadata?.namespace}/${obj.metadata?.name}`;
    let Model;
    try {
      const mod = await import(`${pkg}/${group}/${version}/${obj.kind}`);
      Model = mod[obj.kind];
    } catch (e) {
      console.log(`FAIL ${what}: no schema for ${apiVersion} ${obj.kind}`);
      failed++;
      continue;
    }
    checked++;
    let error = null;
    try {
      new Model(obj).validate();
    } catch (e) {
      error = e.message.split("\n").slice(0, 6).join(" | ");
    }
    if (expectInvalid) {
      if (error === null) {
        console.log(`FAIL ${what}: accepted, but must be refused`);
        failed++;
      } else {
        console.log(`ok   ${what}: refused (${error.slice(0, 100)})`);
      }
    } else if (error !== null) {
      console.log(`FAIL ${what}: ${error}`);
      failed++;
    } else {
      console.log(`ok   ${what}`);
    }
  }
}
if (checked === 0) {
  console.log("FAIL no object of a group with an npm model found");
  process.exit(1);
}
console.log(`${checked} objects checked, ${failed} failed`);
process.exit(failed > 0 ? 1 : 0);
