import { describe } from "vitest";
import { keyStoreContract } from "../../test/key-store-contract.js";
import { createMemoryKeyStore } from "./memory-key-store.js";

describe("memory key store", () => {
  keyStoreContract(() => createMemoryKeyStore());
});
