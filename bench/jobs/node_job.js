// node, as a new user would try it: a Map of 1.5M small objects built, then walked twice.
// Prints the same `checksum HEX over N objects in S s` line as the demo job.
const crypto = require("crypto");
const n = parseInt(process.argv[2] || "1500000", 10);
const start = process.hrtime.bigint();
const m = new Map();
for (let i = 0; i < n; i++) {
  m.set(i, { id: i, name: "item-" + i, tags: [i % 7, i % 11], score: i * 0.5 });
}
const h = crypto.createHash("sha256");
for (let pass = 0; pass < 2; pass++) {
  let acc = 0;
  for (const [k, v] of m) {
    acc = (acc * 31 + v.id + v.tags[0] + v.tags[1] + v.name.length + Math.floor(v.score)) % 1000000007;
    if (k % 1000 === 0) h.update(String(acc));
  }
  h.update("pass" + pass + ":" + acc);
}
const secs = Number(process.hrtime.bigint() - start) / 1e9;
console.log(`checksum ${h.digest("hex").slice(0, 16)} over ${n} objects in ${secs.toFixed(2)} s`);
