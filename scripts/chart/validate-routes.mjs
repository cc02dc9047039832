// Validates every Gateway API object in the YAML files given (or found under the directories
// given) against the Gateway API schemas of npm @kubernetes-models/gateway-api
// (scripts/check-chart). Exits 1 when an object fails, when its kind or version has no model,
// or when no object was found at all.
//
//   node validate-routes.mjs [--expect-invalid] PATH...
//
// With --expect-invalid every object must fail instead (the check that the check can fail).
import { readFileSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { parseAllDocuments } from "yaml";

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
    if (!apiVersion.startsWith("gateway.networking.k8s.io/")) continue;
    const version = apiVersion.split("/")[1];
    const what = `${file}: ${obj.kind} ${obj.metadata?.namespace}/${obj.metadata?.name}`;
    let Model;
    try {
      const mod = await import(
        `@kubernetes-models/gateway-api/gateway.networking.k8s.io/${version}/${obj.kind}`
      );
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
  console.log("FAIL no Gateway API object found");
  process.exit(1);
}
console.log(`${checked} Gateway API objects checked, ${failed} failed`);
process.exit(failed > 0 ? 1 : 0);
