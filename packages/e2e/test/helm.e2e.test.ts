// The Helm chart (helm/tollgate): what the rendered examples promise, checked on the manifests Helm
// itself renders. For every workload of the production example: probes (gRPC for the gRPC
// services, HTTP for api-edge), requests and limits, a non-root read-only security context, and
// no secret value anywhere; a typo'd key in a values file fails `make helm-lint`.
//
// helm and kubeconform are the pinned binaries deploy/tools/install.sh builds into .tools/bin
// (`make helm-lint` runs first in `make test`, so they are there; a cold machine builds them
// here, which takes minutes once).

import { execFileSync, spawnSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadGatewayConfig, upstreamPolicy } from "@tollgate/config";
import { REPO_ROOT } from "@tollgate/testkit/stack";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";

const HELM = join(REPO_ROOT, ".tools/bin/helm");
const CHART = join(REPO_ROOT, "helm/tollgate");
const LINT = join(REPO_ROOT, "deploy/tools/helm-lint.sh");
const KUBERNETES_VERSION = (/^KUBERNETES_VERSION=v?(\S+)$/m.exec(
  readFileSync(join(REPO_ROOT, "deploy/tools/versions.env"), "utf8"),
)?.[1] ?? "") as string;
const SERVICES = readdirSync(join(REPO_ROOT, "services"), { withFileTypes: true })
  .filter((d) => d.isDirectory())
  .map((d) => d.name)
  .sort();
/** Environment variables that hold secrets: they may only come from a Secret (or a mounted file). */
const SECRET_ENV = /(SECRET|TOKEN|PASSWORD|PASSWD|API_KEY|PRIVATE_KEY|PAYEE_KEY|CREDENTIALS?)$/;

// biome-ignore lint/suspicious/noExplicitAny: rendered Kubernetes objects are untyped YAML.
type K8sObject = Record<string, any>;

let work: string;

function helmTemplate(...valuesFiles: string[]): { status: number | null; stdout: string; stderr: string } {
  const args = ["template", "tollgate", CHART, "-n", "tollgate", "--kube-version", KUBERNETES_VERSION];
  for (const f of valuesFiles) args.push("-f", f);
  const run = spawnSync(HELM, args, { encoding: "utf8" });
  return { status: run.status, stdout: run.stdout, stderr: run.stderr };
}

function render(valuesFile: string): { text: string; objects: K8sObject[] } {
  const run = helmTemplate(valuesFile);
  if (run.status !== 0) throw new Error(`helm template -f ${valuesFile} failed:\n${run.stderr}`);
  const objects = parseAllDocuments(run.stdout)
    .map((d) => d.toJS() as K8sObject | null)
    .filter((o): o is K8sObject => o !== null);
  return { text: run.stdout, objects };
}

const WORKLOAD_KINDS = new Set([
  "Deployment",
  "StatefulSet",
  "DaemonSet",
  "ReplicaSet",
  "Job",
  "CronJob",
  "Pod",
]);

function podSpecOf(o: K8sObject): K8sObject {
  if (o.kind === "Pod") return o.spec;
  if (o.kind === "CronJob") return o.spec.jobTemplate.spec.template.spec;
  return o.spec.template.spec;
}

function componentOf(o: K8sObject): string {
  return o.metadata?.labels?.["app.kubernetes.io/component"];
}

const VALUES_FILES = [
  ...readdirSync(join(REPO_ROOT, "deploy/values"))
    .filter((f) => f.endsWith(".yaml"))
    .map((f) => join(REPO_ROOT, "deploy/values", f)),
  ...readdirSync(join(CHART, "ci"))
    .filter((f) => f.endsWith(".yaml"))
    .map((f) => join(CHART, "ci", f)),
];
const PRODUCTION = join(REPO_ROOT, "deploy/values/production.yaml");

beforeAll(() => {
  // Builds the pinned tools on a cold machine (minutes, once); a no-op when they are cached.
  execFileSync("bash", [join(REPO_ROOT, "deploy/tools/install.sh")], { stdio: "inherit" });
  work = mkdtempSync(join(tmpdir(), "tollgate-helm-"));
}, 900_000);

afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

describe("the production example, rendered", () => {
  let objects: K8sObject[];
  let text: string;
  let workloads: K8sObject[];

  beforeAll(() => {
    ({ objects, text } = render(PRODUCTION));
    workloads = objects.filter((o) => WORKLOAD_KINDS.has(o.kind));
  });

  it("has one Deployment per service folder, and no other kind of workload", () => {
    expect(workloads.map((w) => `${w.kind}/${componentOf(w)}`).sort()).toEqual(
      SERVICES.map((s) => `Deployment/${s}`),
    );
  });

  it("gives every workload startup, readiness and liveness probes: HTTP for api-edge, gRPC for the rest", () => {
    for (const w of workloads) {
      const name = componentOf(w);
      for (const c of podSpecOf(w).containers) {
        const grpcPort = c.ports?.find((p: K8sObject) => p.name === "grpc")?.containerPort;
        // Kubelet probes cannot present a client certificate: they ask the plaintext health port.
        const healthPort = c.ports?.find((p: K8sObject) => p.name === "health")?.containerPort;
        for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
          const p = c[probe];
          expect(p, `${name}: ${probe}`).toBeDefined();
          if (name === "api-edge") {
            const httpPort = c.ports.find((x: K8sObject) => x.name === "http").containerPort;
            expect(p.httpGet, `${name}: ${probe} is HTTP`).toBeDefined();
            expect(p.httpGet.port).toBe(httpPort);
            expect(p.httpGet.path).toBe(probe === "readinessProbe" ? "/readyz" : "/livez");
          } else {
            expect(grpcPort, `${name} has a grpc port`).toBeTypeOf("number");
            expect(p.grpc, `${name}: ${probe} is a native gRPC probe`).toBeDefined();
            expect(healthPort, `${name} has a health port`).toBeTypeOf("number");
            expect(p.grpc.port).toBe(healthPort);
            // Liveness never follows Redis/NATS readiness: an outage must not restart pods.
            if (probe === "livenessProbe") expect(p.grpc.service).toBe("liveness");
            // start() waits for a Redis or NATS that is down before the health port opens: the
            // startup probe lets it wait 5 minutes rather than restart it into a backoff.
            if (probe === "startupProbe")
              expect(p.periodSeconds * p.failureThreshold).toBeGreaterThanOrEqual(300);
          }
        }
      }
    }
  });

  it("sets requests and limits of CPU and memory on every container", () => {
    for (const w of workloads) {
      for (const c of podSpecOf(w).containers) {
        for (const kind of ["requests", "limits"])
          for (const r of ["cpu", "memory"])
            expect(c.resources?.[kind]?.[r], `${componentOf(w)}: resources.${kind}.${r}`).toBeDefined();
      }
    }
  });

  it("runs every container as non-root on a read-only root with no capabilities, /tmp an emptyDir", () => {
    for (const w of workloads) {
      const name = componentOf(w);
      const pod = podSpecOf(w);
      expect(pod.securityContext.runAsNonRoot, name).toBe(true);
      expect(pod.securityContext.runAsUser, name).toBeGreaterThan(0);
      expect(pod.securityContext.seccompProfile.type, name).toBe("RuntimeDefault");
      expect(pod.automountServiceAccountToken, name).toBe(false);
      for (const c of pod.containers) {
        const sc = c.securityContext;
        expect(sc.runAsNonRoot, name).toBe(true);
        expect(sc.readOnlyRootFilesystem, name).toBe(true);
        expect(sc.allowPrivilegeEscalation, name).toBe(false);
        expect(sc.privileged ?? false, name).toBe(false);
        expect(sc.capabilities.drop, name).toContain("ALL");
        expect(sc.capabilities.add ?? [], name).toEqual([]);
        const tmp = c.volumeMounts.find((m: K8sObject) => m.mountPath === "/tmp");
        expect(tmp, `${name}: /tmp`).toBeDefined();
        expect(pod.volumes.find((v: K8sObject) => v.name === tmp.name).emptyDir, name).toBeDefined();
      }
    }
  });

  it("rolls out without taking a ready replica away, and has a disruption budget per service", () => {
    for (const w of workloads) {
      expect(w.spec.strategy.rollingUpdate.maxUnavailable, componentOf(w)).toBe(0);
    }
    const pdbs = objects.filter((o) => o.kind === "PodDisruptionBudget").map(componentOf);
    expect(pdbs.sort()).toEqual(SERVICES);
  });

  it("autoscales inference-router, which api-edge reaches through a headless Service", () => {
    const hpa = objects.find(
      (o) => o.kind === "HorizontalPodAutoscaler" && componentOf(o) === "inference-router",
    );
    expect(hpa?.spec.scaleTargetRef).toEqual({
      apiVersion: "apps/v1",
      kind: "Deployment",
      name: "tollgate-inference-router",
    });
    expect(workloads.find((w) => componentOf(w) === "inference-router")?.spec.replicas).toBeUndefined();
    const headless = objects.find(
      (o) => o.kind === "Service" && o.metadata.name === "tollgate-inference-router-headless",
    );
    expect(headless?.spec.clusterIP).toBe("None");
    const edge = workloads.find((w) => componentOf(w) === "api-edge");
    const addr = podSpecOf(edge!).containers[0].env.find(
      (e: K8sObject) => e.name === "INFERENCE_ROUTER_ADDR",
    );
    expect(addr.value).toBe("dns:///tollgate-inference-router-headless.tollgate.svc.cluster.local:50053");
  });

  it("bounds each process's stop inside its pod's grace period, leaving a stream of the longest upstream timeout room to finish", () => {
    const bounds = new Map<string, number>();
    for (const w of workloads) {
      const pod = podSpecOf(w);
      const container = pod.containers[0];
      const bound = Number(
        container.env.find((e: K8sObject) => e.name === "SHUTDOWN_TIMEOUT_SECONDS")?.value,
      );
      const preStop = container.lifecycle?.preStop?.sleep?.seconds ?? 0;
      // Exits 5 s before the kubelet would kill it, after the preStop sleep.
      expect(bound, componentOf(w)).toBe(pod.terminationGracePeriodSeconds - preStop - 5);
      bounds.set(componentOf(w), bound);
    }
    const configMap = objects.find((o) => o.kind === "ConfigMap" && o.data?.["config.yaml"]);
    const path = join(work, "production-config.yaml");
    writeFileSync(path, configMap!.data["config.yaml"]);
    const gateway = loadGatewayConfig(path);
    const longest = Math.max(
      ...gateway.upstreams.map((u) => upstreamPolicy(gateway.resilience, u).timeouts.totalMs),
    );
    // A router lets its streams run for its bound less 5 s (services/inference-router/src/app.ts,
    // streamGraceMs); api-edge waits for them within its own.
    expect((bounds.get("inference-router")! - 5) * 1_000).toBeGreaterThanOrEqual(longest);
    expect(bounds.get("api-edge")! * 1_000).toBeGreaterThanOrEqual(longest);
  });

  it("holds no secret value: no Secret objects, secrets only by secretKeyRef or mounted Secret files", () => {
    expect(objects.filter((o) => o.kind === "Secret")).toEqual([]);
    const referenced = new Set<string>();
    for (const w of workloads) {
      const pod = podSpecOf(w);
      for (const c of pod.containers) {
        for (const e of c.env ?? []) {
          if (SECRET_ENV.test(e.name) || e.name === "REDIS_URL") {
            // Production's Redis URL carries a password: it too comes from a Secret.
            expect(e.value, `${componentOf(w)}: ${e.name} has a literal value`).toBeUndefined();
            expect(e.valueFrom?.secretKeyRef?.name, `${componentOf(w)}: ${e.name}`).toBeTruthy();
            referenced.add(e.name);
          }
          if (e.name.endsWith("_FILE")) {
            // A path into a volume projected from Secrets, never the secret itself.
            const mount = c.volumeMounts.find((m: K8sObject) => e.value.startsWith(`${m.mountPath}/`));
            expect(mount, `${componentOf(w)}: ${e.name} points into a mount`).toBeDefined();
            const volume = pod.volumes.find((v: K8sObject) => v.name === mount.name);
            const sources = volume.projected?.sources ?? (volume.secret ? [{ secret: volume.secret }] : []);
            expect(sources.length, `${componentOf(w)}: ${e.name} is a Secret volume`).toBeGreaterThan(0);
            for (const s of sources) expect(Object.keys(s)).toEqual(["secret"]);
            referenced.add(e.name);
          }
        }
      }
    }
    // Each kind of secret of the example is there, by reference.
    expect([...referenced].sort()).toEqual(
      [
        "ADMIN_TOKEN",
        "INTERNAL_PEER_TOKENS_FILE",
        "INTERNAL_TOKEN_FILE",
        "MPP_PAYEE_KEY_FILE",
        "MPP_SECRET_FILE",
        "OPENAI_API_KEY",
        "REDIS_URL",
      ].sort(),
    );
    // The configuration carries neither a clear-text Virtual Key nor a provider key.
    const config = objects.find((o) => o.kind === "ConfigMap" && o.data?.["config.yaml"] !== undefined)?.data[
      "config.yaml"
    ] as string;
    expect(config).not.toMatch(/^\s*-?\s*secret:/m);
    expect(config).not.toMatch(/apiKey:/);
    // Nothing shaped like a private key, a bearer token or a provider key anywhere in the output.
    expect(text).not.toMatch(/0x[0-9a-fA-F]{64}/);
    expect(text).not.toMatch(/\b(sk-[A-Za-z0-9]{16,}|tg_[A-Za-z0-9_]{16,})/);
    expect(text).not.toMatch(/-----BEGIN/);
  });
});

describe("every example and CI values file", () => {
  it.each(VALUES_FILES.map((f) => [f.slice(REPO_ROOT.length)]))(
    "%s renders workloads with secrets only by reference and a valid Tollgate configuration",
    (rel) => {
      const { objects } = render(join(REPO_ROOT, rel));
      for (const w of objects.filter((o) => WORKLOAD_KINDS.has(o.kind))) {
        for (const c of podSpecOf(w).containers)
          for (const e of c.env ?? [])
            if (SECRET_ENV.test(e.name))
              expect(e.value, `${rel}: ${componentOf(w)} ${e.name}`).toBeUndefined();
      }
      const config = objects.find((o) => o.kind === "ConfigMap" && o.data?.["config.yaml"] !== undefined)
        ?.data["config.yaml"];
      if (config !== undefined) {
        const path = join(work, `config-${Math.random().toString(36).slice(2)}.yaml`);
        writeFileSync(path, config);
        expect(() => loadGatewayConfig(path), `${rel}: the Tollgate configuration`).not.toThrow();
      }
    },
  );
});

describe("values.schema.json refuses typos", () => {
  const broken = (name: string, text: string) => {
    const path = join(work, name);
    writeFileSync(path, text);
    return path;
  };

  it("fails make helm-lint's script and helm template on a misspelled replicas key", () => {
    const typo = broken("typo.yaml", "components:\n  inference-router:\n    replicaCount: 3\n");
    const lint = spawnSync("bash", [LINT, typo], { encoding: "utf8" });
    expect(lint.status).not.toBe(0);
    expect(lint.stdout + lint.stderr).toContain("additional properties 'replicaCount' not allowed");
    const template = helmTemplate(join(REPO_ROOT, "deploy/values/dev.yaml"), typo);
    expect(template.status).not.toBe(0);
    expect(template.stderr).toContain("replicaCount");
  });

  it.each([
    ["a top-level key", "logLevl: debug\n", "logLevl"],
    [
      "a nested key",
      "components:\n  api-edge:\n    probe:\n      type: http\n      port: http\n      livenesPath: /livez\n",
      "livenesPath",
    ],
    [
      "a secret given as a plain setting",
      "components:\n  mpp-payment:\n    env:\n      MPP_SECRET: not-here\n",
      "MPP_SECRET",
    ],
    ["credentials in the Redis URL", "redis:\n  url: redis://:hunter2@redis:6379\n", "/redis/url"],
    ["a component without resources", "components:\n  new-thing:\n    enabled: true\n", "new-thing"],
  ])("rejects %s", (_what, text, mention) => {
    const run = helmTemplate(join(REPO_ROOT, "deploy/values/dev.yaml"), broken("bad.yaml", text));
    expect(run.status).not.toBe(0);
    expect(run.stderr).toContain(mention);
  });

  it("passes on the repository's own values files (what make helm-lint runs)", () => {
    const lint = spawnSync("bash", [LINT], { encoding: "utf8" });
    expect(lint.stderr).not.toContain("FAIL");
    expect(lint.status).toBe(0);
    expect(lint.stdout).toContain(`${VALUES_FILES.length} values files linted, rendered and valid`);
  });
});

describe("the chart follows the service folders", () => {
  it("has a values block, an image stage and a README row for every service", () => {
    const values = readFileSync(join(CHART, "values.yaml"), "utf8");
    const readme = readFileSync(join(REPO_ROOT, "README.md"), "utf8");
    const dockerfile = readFileSync(join(REPO_ROOT, "deploy/build/Dockerfile"), "utf8");
    for (const s of SERVICES) {
      expect(values, `helm/tollgate/values.yaml: components.${s}`).toMatch(new RegExp(`^  ${s}:$`, "m"));
      expect(dockerfile, `deploy/build/Dockerfile: stage ${s}`).toMatch(
        new RegExp(`^FROM runtime AS ${s}$`, "m"),
      );
      expect(readme, `README.md row for ${s}`).toContain(`| \`${s}\` |`);
    }
  });
});
