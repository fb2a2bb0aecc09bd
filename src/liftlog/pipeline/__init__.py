"""The reference pipeline: NATS -> a partitioned liftlog stream -> Structured Streaming -> liftlog and Parquet.

One machine, one command after ``make run``::

    liftlog pipeline run --events 10000     # or: python -m liftlog.pipeline run --events 10000
    liftlog pipeline results

The parts, each usable on its own:

- :mod:`.generator`: synthetic click/view/order events, deterministic for a
  seed, some of them late, published as JSON on NATS subjects
  ``<prefix>.<kind>[.<partition>]`` that one liftlog stream records
  (plain Python, no Spark).
- :mod:`.job`: the Structured Streaming job, per-key counts over event-time
  windows with a watermark, written to a compacted liftlog stream (every
  update, latest per key) and to Parquet (closed windows). Also a
  ``spark-submit`` script.
- :mod:`.runner`: the whole path on one machine, with a progress snapshot.
- :mod:`.results`: reading the results back without Spark.
- :mod:`.cli`: the ``liftlog pipeline`` commands.

Only :mod:`.job`, :mod:`.runner` and :mod:`.cli`'s ``run`` need the
``spark`` extra; importing this package imports nothing.
"""
