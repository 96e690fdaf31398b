import { execFileSync } from "node:child_process";
import { REPO_ROOT } from "@tollgate/testkit/stack";
import { describe, expect, it } from "vitest";

// What the peer gateway does: listen on a port without naming a host (every interface).
const SERVER = `
const { createServer } = await import("node:http");
const s = createServer();
s.listen(0, () => { console.log(JSON.stringify(s.address())); s.close(); });
`;

function addressWith(preloads: string[]): { address: string } {
  const out = execFileSync(
    process.execPath,
    [...preloads.flatMap((p) => ["--import", p]), "--input-type=module", "-e", SERVER],
    { cwd: REPO_ROOT, encoding: "utf8" },
  );
  return JSON.parse(out.trim()) as { address: string };
}

describe("the peer's loopback preload", () => {
  it("binds a server that names no host to 127.0.0.1 instead of every interface", () => {
    expect(addressWith([]).address).not.toBe("127.0.0.1");
    expect(addressWith(["./bench/lib/listen-loopback.mjs"]).address).toBe("127.0.0.1");
  });
});
