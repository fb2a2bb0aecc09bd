"""liftlog streams as a Spark data source (format ``liftlog``): batch and Structured Streaming, read and write.

Issue 6, in progress. ``options`` (the source and sink options, checked at
planning) and ``offsets`` (offset ranges, their JSON form, admission control)
are plain Python and import without pyspark; the data source itself needs the
``spark`` extra.
"""
