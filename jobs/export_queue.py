"""spark-submit / Glue entry point: export a queue's items (a dead-letter queue, say) to Parquet.

See docs/spark.md.

    spark-submit --py-files querator-0.1.0-pyfiles.zip jobs/export_queue.py \
        --queue orders-dead --output s3://bucket/exports/orders-dead/ \
        --items-table querator-items --catalog-table querator-queues

The work is in ``querator.spark.cli``; this file only gives spark-submit and Glue a script to run.
"""

from __future__ import annotations

import sys

from querator.spark.cli import export_main

if __name__ == "__main__":
    sys.exit(export_main())
