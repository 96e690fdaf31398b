import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RpcProxy, startRpcProxy } from "./rpc-proxy.js";

/** A loopback JSON-RPC node that answers every call with its method name and counts what it saw. */
let node: Server;
let seen: string[];
let proxy: RpcProxy;

const call = (method: string) =>
  fetch(proxy.url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method, params: [] }),
  });

beforeAll(async () => {
  seen = [];
  node = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => {
      body += c;
    });
    req.on("end", () => {
      const { id, method } = JSON.parse(body) as { id: number; method: string };
      seen.push(method);
      res
        .writeHead(200, { "content-type": "application/json" })
        .end(JSON.stringify({ jsonrpc: "2.0", id, result: method }));
    });
  });
  await new Promise<void>((r) => node.listen(0, "127.0.0.1", () => r()));
  proxy = await startRpcProxy({ target: `http://127.0.0.1:${(node.address() as AddressInfo).port}` });
});

afterAll(async () => {
  await proxy.close();
  await new Promise<void>((r) => node.close(() => r()));
});

describe("rpc proxy", () => {
  it("passes calls through, fails one method with a 5xx the node never sees, and heals", async () => {
    expect(await (await call("eth_chainId")).json()).toMatchObject({ result: "eth_chainId" });
    proxy.set("eth_sendRawTransaction", { kind: "fail", status: 502 });
    const failed = await call("eth_sendRawTransaction");
    expect(failed.status).toBe(502);
    expect(seen).not.toContain("eth_sendRawTransaction");
    // Other methods still pass.
    expect((await call("eth_call")).status).toBe(200);
    proxy.reset();
    expect((await call("eth_sendRawTransaction")).status).toBe(200);
    expect(seen.filter((m) => m === "eth_sendRawTransaction")).toHaveLength(1);
    expect(proxy.calls.map((c) => c.fault)).toEqual(["pass", "fail", "pass", "pass"]);
  });

  it("drops the connection, with or without letting the node act first", async () => {
    proxy.set("*", { kind: "drop" });
    await expect(call("eth_blockNumber")).rejects.toThrow();
    expect(seen).not.toContain("eth_blockNumber");
    proxy.set("*", { kind: "drop", forward: true });
    await expect(call("eth_getLogs")).rejects.toThrow();
    expect(seen).toContain("eth_getLogs");
    proxy.reset();
  });

  it("delays the answer after the node acted", async () => {
    proxy.set("eth_getBalance", { kind: "delay", ms: 300 });
    const started = Date.now();
    const aborted = fetch(proxy.url, {
      method: "POST",
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "eth_getBalance" }),
      signal: AbortSignal.timeout(100),
    });
    await expect(aborted).rejects.toThrow();
    expect(Date.now() - started).toBeLessThan(280);
    // The node got it on time even though the caller gave up.
    await new Promise((r) => setTimeout(r, 50));
    expect(seen).toContain("eth_getBalance");
    const slow = Date.now();
    expect((await call("eth_getBalance")).status).toBe(200);
    expect(Date.now() - slow).toBeGreaterThanOrEqual(290);
    proxy.reset();
  });
});
