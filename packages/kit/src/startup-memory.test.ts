import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { childScript, outputOf } from "./child-script.js";

const moduleUrl = JSON.stringify(fileURLToPath(new URL("./startup-memory.ts", import.meta.url)));

// A child that allocates the way loading modules does (many objects that live a while, most of
// them dropped after), which grows V8's young generation, then calls releaseStartupMemory and
// reports what it answered with its RSS and young generation before and after.
const script = `import v8 from "node:v8";
import { releaseStartupMemory } from ${moduleUrl};
const mb = (n) => n / 2 ** 20;
const young = () => mb(v8.getHeapSpaceStatistics().find((s) => s.space_name === "new_space").physical_space_size);
let keep = [];
for (let round = 0; round < 40; round++) {
  const batch = [];
  for (let i = 0; i < 20000; i++) batch.push({ i, s: "x" + i, a: [i, i + 1] });
  keep.push(batch);
  if (keep.length > 8) keep.shift();
}
keep = [];
await new Promise((r) => setTimeout(r, 100));
const before = { rss: mb(process.memoryUsage().rss), young: young() };
const released = releaseStartupMemory();
await new Promise((r) => setTimeout(r, 100));
console.log(JSON.stringify({ released, before, after: { rss: mb(process.memoryUsage().rss), young: young() } }));`;

type Report = {
  released: boolean;
  before: { rss: number; young: number };
  after: { rss: number; young: number };
};

async function run(nodeFlags: string[]): Promise<Report> {
  const { out, err, code } = await outputOf(childScript(script, nodeFlags));
  expect(code, err).toBe(0);
  return JSON.parse(out.trim()) as Report;
}

describe("releaseStartupMemory", () => {
  // V8 takes the "last resort" flavour of gc() from Node 22 on; the images run Node 24.
  it.runIf(Number(process.versions.node.split(".")[0]) >= 22)(
    "with --expose-gc, gives back what start-up grew: the young generation shrinks below 2 MB and RSS drops by over 20 MB",
    async () => {
      const r = await run(["--expose-gc"]);
      expect(r.released).toBe(true);
      expect(r.before.young).toBeGreaterThan(8);
      expect(r.after.young).toBeLessThan(2);
      expect(r.before.rss - r.after.rss).toBeGreaterThan(20);
    },
    20_000,
  );

  it("without --expose-gc (a service run from source) does nothing and says so", async () => {
    const r = await run([]);
    expect(r.released).toBe(false);
    expect(r.after.young).toBeGreaterThan(8);
  }, 20_000);
});
