import type { AccessTable } from "@tollgate/kit/credentials";
import type { MethodsOf } from "@tollgate/kit/grpc";
import type { AuthService } from "@tollgate/proto/auth";

/**
 * Who may call each AuthService method (docs/kubernetes.md, "Internal authentication"). api-edge authorizes
 * public requests (one at a time, or on leases) and runs the admin API (keys, accounts, connections); metering settles the
 * budget reservations of the usage it applies, a batch of usage events at a time.
 */
export const authAccess: AccessTable<MethodsOf<typeof AuthService>> = {
  authorize: ["api-edge"],
  acquireLease: ["api-edge"],
  returnLease: ["api-edge"],
  settleReservation: ["api-edge", "metering"],
  settleReservations: ["metering"],
  createAccount: ["api-edge"],
  createConnection: ["api-edge"],
  createKey: ["api-edge"],
  listKeys: ["api-edge"],
  revokeKey: ["api-edge"],
  rotateKey: ["api-edge"],
  listAccounts: ["api-edge"],
  getAccount: ["api-edge"],
  updateAccount: ["api-edge"],
  deleteAccount: ["api-edge"],
  getConnection: ["api-edge"],
  updateConnection: ["api-edge"],
  deleteConnection: ["api-edge"],
  getKey: ["api-edge"],
  updateKey: ["api-edge"],
};
