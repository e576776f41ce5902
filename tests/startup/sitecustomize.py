"""Run at the start of every Python process of the test suite (``make test`` puts this folder on
``PYTHONPATH``): the jobs' ranks and helpers spend most of their CPU importing torch and Lightning,
and about a seventh of that in the cyclic garbage collector walking the objects those imports just
made. A higher first threshold collects less often; nothing the tests check depends on when cycles
are collected."""

import gc

gc.set_threshold(20_000, 50, 100)
