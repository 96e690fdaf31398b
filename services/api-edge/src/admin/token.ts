import { createHash, timingSafeEqual } from "node:crypto";
import { AdminError } from "./errors.js";

const digest = (value: string) => createHash("sha256").update(value, "utf8").digest();

/**
 * Builds the admin token check. Both sides are hashed first so that the comparison takes the
 * same time whatever the presented token's length or content (timingSafeEqual alone would
 * throw, and so leak, on a length mismatch).
 */
export function adminTokenCheck(token: string): (authorization: string | undefined) => void {
  const expected = digest(token);
  return (authorization) => {
    const match = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(authorization ?? "");
    if (!match) {
      throw new AdminError(
        "missing_admin_token",
        "send the admin token as Authorization: Bearer <ADMIN_TOKEN>",
      );
    }
    if (!timingSafeEqual(digest(match[1]!), expected)) {
      throw new AdminError("invalid_admin_token", "the admin token is not valid");
    }
  };
}
