"""spark-submit / Glue entry point: produce a Parquet, JSON or CSV source into a queue (docs/spark.md).

    spark-submit --py-files querator-0.1.0-pyfiles.zip jobs/produce.py \
        --source s3://bucket/orders/ --format parquet --queue orders --job-id orders-2026-11-23 \
        --staging-dir s3://bucket/querator-jobs \
        --payload body --key order_id --items-table querator-items --catalog-table querator-queues

The work is in ``querator.spark.cli``; this file only gives spark-submit and Glue a script to run.
"""

from __future__ import annotations

import sys

from querator.spark.cli import produce_main

if __name__ == "__main__":
    sys.exit(produce_main())
