"""The HTTP endpoint under concurrent clients, its errors, and the JSONL batch interface."""

import http.client
import io
import json
import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from concerto.config import TINY  # noqa: E402
from concerto.engine import Engine  # noqa: E402
from concerto.executor import EngineExecutor, VirtualClock, WallClock  # noqa: E402
from concerto.latency import ProfiledLatency  # noqa: E402
from concerto.policy import SLO, SystemConfig  # noqa: E402
from concerto.reference import ReferenceDecoder  # noqa: E402
from concerto.scheduler import Scheduler  # noqa: E402
from concerto.server import BadRequest, Service, encode_text, run_batch_file, serve_http  # noqa: E402
from concerto.store import HostStore  # noqa: E402

LAT = ProfiledLatency([1e-3, 1e-4, 2e-4, 0.0, 0.0], [], n_layers=2)


def scheduler(clock):
    engine = Engine(TINY, num_blocks=128, block_size=8)
    store = HostStore(256, 8, engine.cache.token_bytes)
    return Scheduler(SystemConfig.named("concerto"), EngineExecutor(engine, clock, store), clock, LAT,
                     slo=SLO(0.5, 0.1), max_context=TINY.max_seq_len, log=lambda m: None)


class TestHTTP(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.svc = Service(scheduler(WallClock()), "concerto-tiny", TINY.vocab_size, request_timeout=60).start()
        cls.httpd = serve_http(cls.svc, "127.0.0.1", 0)
        cls.port = cls.httpd.server_address[1]
        cls.ref = ReferenceDecoder(TINY)

    @classmethod
    def tearDownClass(cls):
        cls.httpd.shutdown()
        cls.httpd.server_close()
        cls.svc.shutdown()

    def post(self, path, body, raw=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("POST", path, body=raw if raw is not None else json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        out = (r.status, json.loads(r.read()))
        c.close()
        return out

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("GET", path)
        r = c.getresponse()
        out = (r.status, json.loads(r.read()))
        c.close()
        return out

    def test_concurrent_clients_get_their_own_greedy_tokens(self):
        prompts = [[(7 * i + j) % 256 for j in range(5 + 3 * i)] for i in range(8)] + ["hello", "concerto!"]
        results = [None] * len(prompts)

        def client(i):
            results[i] = self.post("/v1/completions", {"prompt": prompts[i], "max_tokens": 6})

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for p, (status, body) in zip(prompts, results):
            self.assertEqual(status, 200, body)
            toks = encode_text(p) if isinstance(p, str) else p
            self.assertEqual(body["choices"][0]["tokens"], self.ref.generate(toks, 6))
            self.assertEqual(body["usage"]["completion_tokens"], 6)
            self.assertGreaterEqual(body["timing"]["ttft_s"], 0)

    def test_errors_are_400_with_a_message(self):
        cases = [
            (None, b"{not json", "malformed JSON"),
            ({"prompt": [1, 2], "max_tokens": 2, "bogus": 1}, None, "unknown field"),
            ({"max_tokens": 2}, None, "missing field: prompt"),
            ({"prompt": [1, 999]}, None, "outside the vocabulary"),
            ({"prompt": [1] * 300, "max_tokens": 4}, None, "exceeds the model's context"),
            ({"prompt": "x", "max_tokens": 0}, None, "max_tokens"),
            ({"prompt": "x", "temperature": 0.7}, None, "greedy"),
        ]
        for body, raw, msg in cases:
            status, out = self.post("/v1/completions", body, raw)
            self.assertEqual(status, 400, (body, out))
            self.assertIn(msg, out["error"]["message"])
        self.assertEqual(self.post("/v1/nothing", {})[0], 404)

    def test_batch_endpoint(self):
        status, out = self.post("/v1/batches", {"requests": [{"prompt": [1, 2, 3], "max_tokens": 3, "id": "a"}, {"prompt": "hi", "max_tokens": 2}]})
        self.assertEqual(status, 200, out)
        for r in self.svc.batches[out["id"]]:
            r.event.wait(30)
        status, got = self.get(f"/v1/batches/{out['id']}")
        self.assertEqual(got["status"], "completed")
        self.assertEqual(got["results"][0]["tokens"], self.ref.generate([1, 2, 3], 3))
        self.assertEqual(self.get("/health")[1]["status"], "ok")
        self.assertEqual(self.post("/v1/batches", {"requests": [{"prompt": [1], "what": 1}]})[0], 400)


class TestBatchFile(unittest.TestCase):
    def test_jsonl_in_jsonl_out(self):
        lines = io.StringIO('{"prompt": [5, 6, 7], "max_tokens": 4, "id": "x"}\n\n{"prompt": "abc", "max_tokens": 2}\n')
        out = list(run_batch_file(scheduler(VirtualClock()), lines, TINY.vocab_size))
        ref = ReferenceDecoder(TINY)
        self.assertEqual([o["id"] for o in out], ["x", "line-3"])
        self.assertEqual(out[0]["tokens"], ref.generate([5, 6, 7], 4))
        self.assertEqual(out[1]["tokens"], ref.generate(encode_text("abc"), 2))

    def test_bad_line_is_named(self):
        with self.assertRaisesRegex(BadRequest, "line 2: malformed JSON"):
            list(run_batch_file(scheduler(VirtualClock()), io.StringIO('{"prompt": [1]}\n{oops\n'), TINY.vocab_size))


if __name__ == "__main__":
    unittest.main()
