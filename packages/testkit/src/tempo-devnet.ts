// The Tempo devnet lives in @tollgate/demo (the all-in-one's demo mode runs it); the tests keep
// importing it from here.
export * from "@tollgate/demo/tempo-devnet";
