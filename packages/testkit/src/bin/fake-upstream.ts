// The stand-alone fake upstream is packages/demo/src/bin/fake-upstream.ts; this path still
// starts it, for the scripts that launch it from here.
import "@tollgate/demo/bin/fake-upstream";
