// What installing the package brings along: connect and protobuf only, so
// that an application's bundle and supply chain grow by nothing else.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { it } from "node:test";

import { REPO } from "./repo.js";

it("depends at run time on connect and protobuf only", () => {
  const pkg = JSON.parse(readFileSync(join(REPO, "clientsdk/typescript/package.json"), "utf8")) as {
    dependencies?: Record<string, string>;
    peerDependenciesMeta?: Record<string, { optional?: boolean }>;
    peerDependencies?: Record<string, string>;
  };
  assert.deepEqual(Object.keys(pkg.dependencies ?? {}).sort(), [
    "@bufbuild/protobuf",
    "@connectrpc/connect",
    "@connectrpc/connect-node",
  ]);
  for (const peer of Object.keys(pkg.peerDependencies ?? {})) {
    assert.equal(pkg.peerDependenciesMeta?.[peer]?.optional, true, `peer dependency ${peer} must be optional`);
  }
});
