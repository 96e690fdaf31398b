import { configDefaults, defineConfig } from "vitest/config";

// Three projects: unit tests sit next to the code and touch no network; integration and
// end-to-end tests start real services against real NATS and Redis on loopback. The
// machines have two cores, so workers are capped at two.
//
// Unit tests share their workers' module cache (`isolate: false`): importing the modules
// afresh for each file was most of the unit run's time. A file that changes process-wide
// state another file could see goes in NEEDS_ISOLATION instead, and runs in the
// `unit-isolated` project, in a fresh worker of its own. `make test-unit` runs both.
const UNIT = ["packages/*/src/**/*.test.ts", "services/*/src/**/*.test.ts", "bench/lib/**/*.test.ts"];
const NEEDS_ISOLATION = [
  // Tracing registers OpenTelemetry's global tracer provider, propagator and context
  // manager; kit's test also checks that nothing has loaded the SDK before it is turned on.
  "packages/kit/src/tracing.test.ts",
  "services/api-edge/src/http/tracing.test.ts",
  "services/inference-router/src/adapters/upstream-http/traced-request.test.ts",
  // Mocks tiny-secp256k1 to fail its load: with a shared module cache, vouchers.ts may already
  // hold the real module another file loaded.
  "services/mpp-payment/src/domain/vouchers-unloadable.test.ts",
];

export default defineConfig({
  test: {
    pool: "forks",
    maxWorkers: 2,
    projects: [
      {
        test: {
          name: "unit",
          include: UNIT,
          exclude: [...configDefaults.exclude, ...NEEDS_ISOLATION],
          isolate: false,
          testTimeout: 10_000,
        },
      },
      {
        test: {
          name: "unit-isolated",
          include: NEEDS_ISOLATION,
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
