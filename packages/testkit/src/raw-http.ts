import { connect } from "node:net";

/**
 * Sends `request` as it is (a request line and headers the HTTP clients would not send: HTTP/1.0,
 * CONNECT) on a new connection to 127.0.0.1:`port`, and resolves with every byte the server wrote
 * once it closed the connection; rejects when it has not closed within `timeoutMs`.
 */
export function rawExchange(port: number, request: string, timeoutMs = 10_000): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, "127.0.0.1", () => socket.write(request));
    let text = "";
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => {
      text += chunk;
    });
    socket.on("close", () => resolve(text));
    socket.on("error", reject);
    socket.setTimeout(timeoutMs, () => {
      socket.destroy();
      reject(new Error(`not closed after ${timeoutMs} ms; got ${JSON.stringify(text)}`));
    });
  });
}
