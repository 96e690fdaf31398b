// Preload (`node --import ./bench/lib/listen-loopback.mjs …`) for a peer gateway that listens on
// every interface: a listen call naming a port but no host binds 127.0.0.1 instead.
import net from "node:net";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const [first, second] = args;
  if (typeof first === "number" || (typeof first === "string" && /^\d+$/.test(first))) {
    if (second === undefined || typeof second === "function" || typeof second === "number") {
      args.splice(1, second === undefined ? 1 : 0, "127.0.0.1");
    }
  } else if (first !== null && typeof first === "object" && first.path === undefined && !first.host) {
    args[0] = { ...first, host: "127.0.0.1" };
  }
  return listen.apply(this, args);
};
