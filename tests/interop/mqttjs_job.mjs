// One job of the interoperability matrix with MQTT.js (tests/interop/test_interop_matrix.py):
// connect, subscribe (optional), print "ready", publish, wait for the expected messages, then
// DISCONNECT, or drop the connection without one ("abort", for the will). The job is the JSON
// argument; every event is one JSON line on stdout.
import { readFileSync } from "node:fs";
import mqtt from "mqtt";

const job = JSON.parse(process.argv[2]);
const say = (event) => process.stdout.write(JSON.stringify(event) + "\n");
const fail = (message) => {
  say({ event: "error", message: String(message) });
  process.exit(1);
};
setTimeout(() => fail("timeout"), job.timeout * 1000).unref();

const options = {
  protocolVersion: job.version,
  clientId: job.client_id,
  clean: job.clean,
  reconnectPeriod: 0,
  connectTimeout: job.timeout * 1000,
};
if (job.version === 5 && job.expiry) options.properties = { sessionExpiryInterval: job.expiry };
if (job.will) options.will = { topic: job.will[0], payload: job.will[1], qos: 1, retain: false };
if (job.ca) options.ca = readFileSync(job.ca);

const client = mqtt.connect(job.url, options);
let received = 0;
client.on("error", fail);
client.on("message", (topic, payload, packet) => {
  say({ event: "message", topic, payload: payload.toString(), qos: packet.qos, retain: packet.retain });
  received += 1;
  if (published && received >= job.expect) finish();
});

let finished = false;
let published = false;
function finish() {
  if (finished) return;
  finished = true;
  if (job.abort) {
    client.stream.destroy(); // no DISCONNECT: the broker publishes the will
    say({ event: "done" });
    process.exit(0);
  }
  client.end(false, {}, () => {
    say({ event: "done" });
    process.exit(0);
  });
}

async function publishAll() {
  for (const [topic, payload, qos, retain] of job.publish) {
    await client.publishAsync(topic, payload, { qos, retain });
  }
  published = true;
  if (received >= job.expect) finish();
}

client.on("connect", async () => {
  try {
    if (job.subscribe) {
      const opts = { qos: job.subscribe[1] };
      if (job.selector) opts.properties = { userProperties: { filter: job.selector } };
      const granted = await client.subscribeAsync(job.subscribe[0], opts);
      if (granted.some((g) => g.qos > 2)) fail(`refused: ${JSON.stringify(granted)}`);
    }
    say({ event: "ready" });
    await publishAll();
  } catch (err) {
    fail(err);
  }
});
