#!/usr/bin/env python3
"""Tests of real-gpu/labstats.py (no GPU, no third-party modules):
python3 real-gpu/test_labstats.py. Run by tests/tests/protection_lab.rs too."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import labstats as ls  # noqa: E402


class Quantiles(unittest.TestCase):
    def test_rows(self):
        xs = [float(i) for i in range(1, 101)]  # 1..100
        for name, p, want in [
            ("median of 100", 0.50, 51.0),
            ("p95", 0.95, 96.0),
            ("p99", 0.99, 100.0),
            ("p100 clamps to the last", 1.0, 100.0),
        ]:
            with self.subTest(name):
                self.assertEqual(ls.quantile(xs, p), want)
        self.assertIsNone(ls.quantile([], 0.5))

    def test_window_cuts_by_due_time(self):
        log = [(10.0, 5.0), (10.5, 1.0), (11.0, 9.0), (12.0, 3.0)]
        self.assertEqual(ls.window(log, 10.0, 11.0), [1.0, 5.0])
        self.assertEqual(ls.window(log, 11.0, 13.0), [3.0, 9.0])
        self.assertEqual(ls.window(log, 20.0, 30.0), [])

    def test_latency_log_skips_torn_lines(self):
        with tempfile.NamedTemporaryFile("w", delete=False) as f:
            f.write("1700000000.5 3.250\n1700000001.0 4.5\n1700000001.2 ")
        try:
            self.assertEqual(ls.read_latency_log(f.name), [(1700000000.5, 3.25), (1700000001.0, 4.5)])
        finally:
            os.unlink(f.name)


class Intervals(unittest.TestCase):
    def test_identical_windows_give_one(self):
        w = sorted(float(i % 17 + 1) for i in range(500))
        r = ls.latency_ratios([(w, w)] * 3, boot=200)
        for name in ("p50", "p95", "p99"):
            x, lo, hi = r[name]
            self.assertAlmostEqual(x, 1.0)
            self.assertLessEqual(lo, 1.0)
            self.assertGreaterEqual(hi, 1.0)

    def test_doubled_latency_is_twice_and_inside_its_interval(self):
        alone = sorted(1.0 + (i * 7919 % 1000) / 100.0 for i in range(2000))
        shared = [2 * x for x in alone]
        r = ls.latency_ratios([(shared, alone)] * 3, boot=300)
        for name in ("p50", "p95", "p99"):
            x, lo, hi = r[name]
            self.assertAlmostEqual(x, 2.0)
            self.assertTrue(lo <= 2.0 <= hi, (name, lo, hi))
            self.assertLess(hi - lo, 0.6, (name, lo, hi))

    def test_point_is_the_geometric_mean_of_each_repeats_ratio(self):
        a = [1.0] * 100
        pairs = [([2.0] * 100, a), ([8.0] * 100, a), ([4.0] * 100, a)]
        x, lo, hi = ls.latency_ratios(pairs, boot=200)["p50"]
        self.assertAlmostEqual(x, 4.0)
        # Resampling repeats: the interval stays within their range.
        self.assertTrue(2.0 <= lo <= x <= hi <= 8.0, (lo, x, hi))

    def test_seeded_bootstrap_repeats_itself(self):
        s = sorted(float(i % 31) + 1 for i in range(300))
        a = sorted(float(i % 23) + 1 for i in range(300))
        self.assertEqual(ls.latency_ratios([(s, a)] * 3, boot=100), ls.latency_ratios([(s, a)] * 3, boot=100))

    def test_empty_windows_give_no_numbers(self):
        self.assertEqual(ls.latency_ratios([([], [1.0])], boot=10)["p99"], (None, None, None))
        self.assertEqual(ls.rate_ratio([(None, 10.0)]), (None, None, None))

    def test_trainer_fraction(self):
        x, lo, hi = ls.rate_ratio([(20.0, 50.0), (25.0, 50.0), (30.0, 50.0)], boot=500)
        self.assertAlmostEqual(x, 0.5)
        self.assertTrue(0.4 <= lo <= x <= hi <= 0.6, (lo, x, hi))
        # A window with no step counts as 0, not as no window.
        x, lo, hi = ls.rate_ratio([(0.0, 50.0), (25.0, 50.0), (0.0, 50.0)], boot=500)
        self.assertAlmostEqual(x, 0.5 / 3)
        self.assertEqual(lo, 0.0)
        x, lo, hi = ls.rate_ratio([(0.0, 50.0)] * 3, boot=50)
        self.assertEqual((x, lo, hi), (0.0, 0.0, 0.0))


class Lines(unittest.TestCase):
    def test_case_line_round_trips(self):
        line = ls.case_line(
            "resnet50-0.6/trigger",
            {"service": "resnet50", "load": 0.6, "available": "yes"},
            {"p50": (1.1, 1.0, 1.2), "p95": (1.3, 1.2, 1.4), "p99": (1.5, None, None)},
            (0.45, 0.4, 0.5),
        )
        kv = ls.parse_kv(line)
        self.assertEqual(kv["case"], "resnet50-0.6/trigger")
        self.assertEqual(kv["p50_x"], "1.10")
        self.assertEqual(kv["p99_lo"], "-")
        self.assertEqual(kv["trainer_of_solo"], "0.45")
        self.assertEqual(kv["load"], "0.6")

    def test_figure_is_svg_with_one_bar_per_case(self):
        rows = [
            ls.parse_kv("case=a/mps p99_x=1.50 p99_lo=1.20 p99_hi=1.90 trainer_of_solo=0.5 trainer_lo=0.4 trainer_hi=0.6"),
            ls.parse_kv("case=a/none p99_x=2.10 p99_lo=- p99_hi=- trainer_of_solo=-"),
        ]
        s = ls.svg(rows, "t")
        self.assertTrue(s.startswith("<svg") and s.rstrip().endswith("</svg>"))
        self.assertEqual(s.count("<rect"), 2)


if __name__ == "__main__":
    unittest.main()
