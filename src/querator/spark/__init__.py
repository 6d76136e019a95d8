"""Bulk producer for PySpark (EMR, Glue): a DataFrame into a queue, exactly once per row.

Needs the ``spark`` extra and is never part of the Lambda layer. ``mapping`` and ``retry`` are pure
and import no pyspark; ``producer`` builds the write path inside each executor; ``job`` runs it over
a DataFrame; ``cli`` holds the ``spark-submit`` / Glue entry points (see docs/spark.md).
"""
