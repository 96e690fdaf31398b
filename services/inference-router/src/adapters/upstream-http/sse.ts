/**
 * Reads a text/event-stream body and yields the payload of each `data:` field, one per event
 * (multi-line data fields are joined with "\n" as the SSE spec says). `onBytes` is called as
 * each piece of the body is read, before its events are yielded.
 */
export async function* parseSse(
  body: AsyncIterable<Uint8Array>,
  onBytes?: () => void,
): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let buffer = "";
  let data: string[] = [];
  for await (const bytes of body) {
    onBytes?.();
    buffer += decoder.decode(bytes, { stream: true });
    let newline = buffer.indexOf("\n");
    while (newline !== -1) {
      const line = buffer.slice(0, newline).replace(/\r$/, "");
      buffer = buffer.slice(newline + 1);
      if (line === "") {
        if (data.length > 0) yield data.join("\n");
        data = [];
      } else if (line.startsWith("data:")) {
        data.push(line.slice(line.charAt(5) === " " ? 6 : 5));
      }
      newline = buffer.indexOf("\n");
    }
  }
  if (data.length > 0) yield data.join("\n");
}
