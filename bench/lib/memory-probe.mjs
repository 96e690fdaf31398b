// Preloaded by bench/idle-rss.ts (IDLE_DETAIL=1) into each service through NODE_OPTIONS: on
// SIGUSR2 it writes what the process's memory is made of to /tmp/tollgate-memory-<pid>.json
// (MiB): VmRSS split into anonymous and file-backed pages, process.memoryUsage(), malloc'ed
// memory, V8's code statistics, and each heap space as [size, used, physical].
import { readFileSync, writeFileSync } from "node:fs";
import v8 from "node:v8";

const mib = (bytes) => bytes / 1048576;
process.on("SIGUSR2", () => {
  const status = readFileSync("/proc/self/status", "utf8");
  const kb = (field) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(status)?.[1]) / 1024;
  const heap = v8.getHeapStatistics();
  writeFileSync(
    `/tmp/tollgate-memory-${process.pid}.json`,
    JSON.stringify({
      rss: kb("VmRSS"),
      anon: kb("RssAnon"),
      file: kb("RssFile"),
      memoryUsage: Object.fromEntries(Object.entries(process.memoryUsage()).map(([k, v]) => [k, mib(v)])),
      malloced: mib(heap.malloced_memory),
      code: Object.fromEntries(Object.entries(v8.getHeapCodeStatistics()).map(([k, v]) => [k, mib(v)])),
      spaces: Object.fromEntries(
        v8
          .getHeapSpaceStatistics()
          .map((s) => [
            s.space_name,
            [mib(s.space_size), mib(s.space_used_size), mib(s.physical_space_size)],
          ]),
      ),
    }),
  );
});
