package org.siftmq.spark;

import java.util.Map;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.execution.streaming.Sink;

/**
 * {@code writeStream.format("siftmq")}: each micro-batch written by the Python sink (a batch write
 * of {@value SiftmqProvider#PYTHON_SOURCE}) with the streaming query's id and the batch id as the
 * idempotency key's first parts, so a batch that Spark runs again after a failure re-publishes the
 * same keys. A task's failure fails the batch, and so the query, with the sink's error.
 */
final class PythonSink implements Sink {
  private final Map<String, String> options;

  PythonSink(Map<String, String> options) {
    this.options = options;
  }

  /** Fail at the query's start when the Python sink is not registered in this session. */
  static void check(SparkSession spark) {
    org.apache.spark.sql.classic.SparkSession s = (org.apache.spark.sql.classic.SparkSession) spark;
    if (!s.sessionState().dataSourceManager().dataSourceExists(SiftmqProvider.PYTHON_SOURCE)) {
      throw new IllegalStateException("siftmq sink: format(\"siftmq\") publishes with the Python sink of the "
          + "siftmq package: call bridge.register(spark) in this session first");
    }
  }

  @Override
  public void addBatch(long batchId, Dataset<Row> data) {
    org.apache.spark.sql.classic.SparkSession spark =
        (org.apache.spark.sql.classic.SparkSession) data.sparkSession();
    String queryId = spark.sparkContext().getLocalProperty("sql.streaming.queryId");
    // the micro-batch's rows as a batch DataFrame (a streaming one cannot be written by df.write)
    org.apache.spark.sql.classic.Dataset<Row> rows = (org.apache.spark.sql.classic.Dataset<Row>) data;
    Dataset<Row> batch = spark.internalCreateDataFrame(rows.queryExecution().toRdd(), data.schema(), false);
    batch.write()
        .format(SiftmqProvider.PYTHON_SOURCE)
        .options(options)
        .option("siftmq.queryId", queryId == null ? "-" : queryId)
        .option("siftmq.batchId", Long.toString(batchId))
        .mode("append")
        .save();
  }

  @Override
  public String toString() {
    return "siftmq[MQTT " + options.getOrDefault("url", "") + "]";
  }
}
