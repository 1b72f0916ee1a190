// The jobs of the interoperability matrix with MQTT.js (tests/interop/test_interop_matrix.py):
// one node process per test module reads jobs, one JSON object a line on stdin, and runs each
// (concurrently) with its own client: connect, subscribe (optional), say "ready", publish,
// wait for the expected messages, then DISCONNECT, or drop the connection without one
// ("abort", for the will). Every event is one JSON line on stdout, tagged with the job's id.
// The process ends when stdin closes.
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import mqtt from "mqtt";

const say = (id, event) => process.stdout.write(JSON.stringify({ id, ...event }) + "\n");

function run(job) {
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
  let published = false;
  let finished = false;
  const end = (event) => {
    if (finished) return;
    finished = true;
    clearTimeout(timer);
    say(job.id, event);
  };
  const fail = (err) => {
    end({ event: "error", message: String(err) });
    client.end(true);
  };
  const timer = setTimeout(() => fail("timeout"), job.timeout * 1000);

  const finish = () => {
    if (finished) return;
    if (job.abort) {
      client.stream.destroy(); // no DISCONNECT: the broker publishes the will
      end({ event: "done" });
      client.end(true);
      return;
    }
    client.end(false, {}, () => end({ event: "done" }));
  };

  client.on("error", fail);
  client.on("message", (topic, payload, packet) => {
    say(job.id, { event: "message", topic, payload: payload.toString(), qos: packet.qos, retain: packet.retain });
    received += 1;
    if (published && received >= job.expect) finish();
  });
  client.on("connect", async () => {
    try {
      if (job.subscribe) {
        const opts = { qos: job.subscribe[1] };
        if (job.selector) opts.properties = { userProperties: { filter: job.selector } };
        const granted = await client.subscribeAsync(job.subscribe[0], opts);
        if (granted.some((g) => g.qos > 2)) return fail(`refused: ${JSON.stringify(granted)}`);
      }
      say(job.id, { event: "ready" });
      for (const [topic, payload, qos, retain] of job.publish) {
        await client.publishAsync(topic, payload, { qos, retain });
      }
      published = true;
      if (received >= job.expect) finish();
    } catch (err) {
      fail(err);
    }
  });
}

const lines = createInterface({ input: process.stdin });
lines.on("line", (line) => {
  if (line.trim()) run(JSON.parse(line));
});
lines.on("close", () => process.exit(0));
