import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { ERRORS, type ErrorCode, type ErrorDoor } from "./errors.js";

/** A page of docs/, where each door's error table is documented. */
const page = (name: string) => readFileSync(new URL(`../../../docs/${name}`, import.meta.url), "utf8");

/** The first Markdown table after the line starting with `lead`: each code with its row's statuses. */
function docsTable(name: string, lead: string): Map<string, number[]> {
  const lines = page(name).split("\n");
  const start = lines.findIndex((line) => line.startsWith(lead));
  expect(start, `docs/${name} has no line starting with "${lead}"`).toBeGreaterThanOrEqual(0);
  const first = lines.findIndex((line, i) => i > start && line.startsWith("|"));
  const rows: string[] = [];
  for (let i = first; i < lines.length && lines[i]!.startsWith("|"); i++) rows.push(lines[i]!);
  const codes = new Map<string, number[]>();
  // rows[0] is the header, rows[1] the separator.
  for (const row of rows.slice(2)) {
    const [statusCell = "", codeCell = ""] = row.split("|").slice(1);
    const statuses = [...statusCell.matchAll(/\d{3}/g)].map((m) => Number(m[0]));
    for (const [, code] of codeCell.matchAll(/`([a-z_]+)`/g)) codes.set(code!, statuses);
  }
  return codes;
}

const TABLES: [ErrorDoor, string, string][] = [
  ["account", "account-door.md", "Errors are OpenAI-shaped"],
  ["paid", "paid-door.md", "Paid-door errors are"],
];

describe("the error tables of docs/account-door.md and docs/paid-door.md and the error table agree", () => {
  for (const [door, name, lead] of TABLES) {
    const documented = docsTable(name, lead);
    const ours = (Object.keys(ERRORS) as ErrorCode[]).filter((code) =>
      (ERRORS[code].doors as readonly ErrorDoor[]).includes(door),
    );

    it(`lists every ${door}-door code under its status`, () => {
      const misplaced = ours.flatMap((code) => {
        const statuses = documented.get(code);
        return statuses?.includes(ERRORS[code].http!) ? [] : [`${code} (${ERRORS[code].http})`];
      });
      expect(misplaced).toEqual([]);
    });

    it(`lists no ${door}-door code the error table does not give that door`, () => {
      expect([...documented.keys()].filter((code) => !(ours as string[]).includes(code))).toEqual([]);
    });
  }

  it("gives every code a door sees an HTTP status and a type", () => {
    const incomplete = Object.entries(ERRORS).filter(
      ([, spec]) =>
        (spec.doors.length > 0 && spec.http === null) || (spec.http === null) !== (spec.type === null),
    );
    expect(incomplete.map(([code]) => code)).toEqual([]);
  });
});
