import { defineConfig } from "vitest/config";

// Two projects: unit tests sit next to the code and touch no network; integration and
// end-to-end tests start real services against real NATS and Redis on loopback. The
// machines have two cores, so workers are capped at two.
export default defineConfig({
  test: {
    pool: "forks",
    maxWorkers: 2,
    projects: [
      {
        test: {
          name: "unit",
          include: ["packages/*/src/**/*.test.ts", "services/*/src/**/*.test.ts"],
          testTimeout: 10_000,
        },
      },
      {
        test: {
          name: "integration",
          include: [
            "packages/*/test/**/*.int.test.ts",
            "services/*/test/**/*.int.test.ts",
            "packages/e2e/test/**/*.e2e.test.ts",
          ],
          testTimeout: 60_000,
          hookTimeout: 60_000,
        },
      },
    ],
  },
});
