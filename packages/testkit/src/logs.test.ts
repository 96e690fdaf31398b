import { createLogger } from "@tollgate/kit/log";
import { describe, expect, it } from "vitest";
import { captureLogs } from "./logs.js";

describe("captureLogs", () => {
  it("keeps every line a pino logger writes, at once", () => {
    const logs = captureLogs();
    const log = createLogger({ service: "testkit", destination: logs.stream });
    log.info({ requestId: "r1" }, "request served");
    log.warn("slow");
    expect(logs.lines()).toHaveLength(2);
    expect(logs.records()[0]).toMatchObject({ service: "testkit", requestId: "r1", msg: "request served" });
    expect(logs.text()).toContain('"msg":"slow"');
    logs.clear();
    expect(logs.lines()).toEqual([]);
  });
});
