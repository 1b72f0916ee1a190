package org.siftmq.spark;

import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.SaveMode;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.DataSource;
import org.apache.spark.sql.execution.datasources.FileFormat;
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat;
import org.apache.spark.sql.execution.datasources.v2.parquet.ParquetTable;
import org.apache.spark.sql.execution.streaming.Sink;
import org.apache.spark.sql.execution.streaming.Source;
import org.apache.spark.sql.sources.BaseRelation;
import org.apache.spark.sql.sources.CreatableRelationProvider;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.sources.RelationProvider;
import org.apache.spark.sql.sources.SchemaRelationProvider;
import org.apache.spark.sql.sources.StreamSinkProvider;
import org.apache.spark.sql.sources.StreamSourceProvider;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import scala.Option;
import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;

/**
 * {@code format("siftmq")} on the JVM: the bridge's landing zone read by Spark's own Parquet file
 * source (issue 29). Nothing is read here: every read is handed to Spark over
 * {@code <landing>/<kind>/} with the kind's documented schema, so column pruning, the vectorised
 * reader, filter pushdown and partitioning are Spark's.
 *
 * <ul>
 *   <li>Batch reads ({@code spark.read}) of one landing zone: Spark's Parquet file source (V1,
 *       {@link RelationProvider}: the relation of {@code spark.read.parquet(<landing>/<kind>)}).
 *       Of several ({@code load([L1, L2])}): a {@link TableProvider} (data source V2, which hands
 *       a provider every path; V1 sees one) whose table is Spark's {@link ParquetTable} over the
 *       kind's directory of every landing zone.
 *   <li>Streams ({@code spark.readStream}): a {@link StreamSourceProvider} whose source is Spark's
 *       file stream source over one glob of those directories: its offsets are the file log in the
 *       query's checkpoint ({@code sources/0/}), so a restarted query resumes exactly once.
 *   <li>Writes ({@code df.write}, {@code df.writeStream}): MQTT, by the Python sink of the siftmq
 *       package, registered by {@code bridge.register(spark)} as {@value #PYTHON_SOURCE} (Spark
 *       refuses one name for a JVM provider and a Python data source).
 * </ul>
 */
public final class SiftmqProvider
    implements DataSourceRegister, TableProvider, RelationProvider, SchemaRelationProvider,
        StreamSourceProvider, CreatableRelationProvider, StreamSinkProvider {

  /** The name of the Python data source that writes to MQTT (bridge/_datasource.py). */
  public static final String PYTHON_SOURCE = "siftmq_python";

  @Override
  public String shortName() {
    return "siftmq";
  }

  static Map<String, String> javaMap(scala.collection.Map<String, String> m) {
    return new HashMap<>(CollectionConverters.asJava(m));
  }

  @SuppressWarnings("unchecked")
  static scala.collection.immutable.Map<String, String> scalaMap(Map<String, String> m) {
    return (scala.collection.immutable.Map<String, String>)
        scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(m));
  }

  static scala.collection.immutable.Seq<String> seq(List<String> l) {
    return CollectionConverters.asScala(l).toList();
  }

  // ---- batch reads (data source V2: the provider sees every path of load([...]))

  @Override
  public boolean supportsExternalMetadata() {
    return true; // spark.read.schema(...): a schema of some of the kind's columns
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return LandingRead.of(options.asCaseSensitiveMap(), null, false).schema;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    if (!LandingRead.lower(properties).containsKey("kind")) {
      // a write (df.write asks the table first): no capability, so Spark falls back to the V1
      // CreatableRelationProvider below; a read without kind fails there, naming the option
      return new NoTable(schema);
    }
    LandingRead read = LandingRead.of(properties, schema, true);
    if (read.landings.size() == 1) {
      // one landing zone: Spark falls back to V1 (createRelation below), Spark's file source
      // itself, the very plan of spark.read.parquet; V1 would not see a second path
      return new NoTable(schema);
    }
    SparkSession spark = SparkSession.active();
    List<String> dirs = read.existingKindDirs(spark.sparkContext().hadoopConfiguration());
    Class<? extends FileFormat> fallback = ParquetFileFormat.class;
    return new ParquetTable(
        "siftmq " + read.kind + " " + String.join(",", read.landings),
        spark,
        new CaseInsensitiveStringMap(read.parquetOptions),
        seq(dirs),
        Option.apply(read.schema),
        fallback);
  }

  /** What {@link #getTable} returns for a write: a table that can do nothing. */
  private static final class NoTable implements Table {
    private final StructType schema;

    NoTable(StructType schema) {
      this.schema = schema;
    }

    @Override
    public String name() {
      return "siftmq";
    }

    @Override
    public StructType schema() {
      return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return Collections.emptySet();
    }
  }

  // ---- batch reads through data source V1 (a read Spark did not take through V2: one path)

  @Override
  public BaseRelation createRelation(SQLContext sqlContext, scala.collection.immutable.Map<String, String> parameters) {
    return v1Relation(sqlContext, parameters, null);
  }

  @Override
  public BaseRelation createRelation(
      SQLContext sqlContext, scala.collection.immutable.Map<String, String> parameters, StructType schema) {
    return v1Relation(sqlContext, parameters, schema);
  }

  private static BaseRelation v1Relation(
      SQLContext sqlContext, scala.collection.immutable.Map<String, String> parameters, StructType given) {
    LandingRead read = LandingRead.of(javaMap(parameters), given, true);
    SparkSession spark = sqlContext.sparkSession();
    List<String> dirs = read.existingKindDirs(spark.sparkContext().hadoopConfiguration());
    return parquet(spark, read, dirs, read.parquetOptions).resolveRelation(false, true, false);
  }

  private static DataSource parquet(
      SparkSession spark, LandingRead read, List<String> paths, Map<String, String> options) {
    return new DataSource(
        spark,
        "parquet",
        seq(paths),
        Option.apply(read.schema),
        seq(List.of()),
        Option.empty(),
        scalaMap(options),
        Option.empty(),
        Option.empty());
  }

  // ---- streams

  @Override
  public Tuple2<String, StructType> sourceSchema(
      SQLContext sqlContext,
      Option<StructType> schema,
      String providerName,
      scala.collection.immutable.Map<String, String> parameters) {
    LandingRead read = LandingRead.of(javaMap(parameters), schema.isDefined() ? schema.get() : null, true);
    return new Tuple2<>("siftmq[" + read.kind + "]", read.schema);
  }

  @Override
  public Source createSource(
      SQLContext sqlContext,
      String metadataPath,
      Option<StructType> schema,
      String providerName,
      scala.collection.immutable.Map<String, String> parameters) {
    LandingRead read = LandingRead.of(javaMap(parameters), schema.isDefined() ? schema.get() : null, true);
    Map<String, String> options = new HashMap<>(read.parquetOptions);
    options.put("path", read.kindGlob());
    return parquet(sqlContext.sparkSession(), read, List.of(), options).createSource(metadataPath);
  }

  // ---- writes: the Python sink

  @Override
  public BaseRelation createRelation(
      SQLContext sqlContext,
      SaveMode mode,
      scala.collection.immutable.Map<String, String> parameters,
      Dataset<Row> data) {
    if (mode != SaveMode.Append && mode != SaveMode.Overwrite) {
      throw new IllegalArgumentException("siftmq sink: save mode " + mode
          + ": an MQTT broker has no table to check; use mode(\"append\")");
    }
    PythonSink.check(sqlContext.sparkSession());
    data.write()
        .format(PYTHON_SOURCE)
        .options(javaMap(parameters))
        .mode(mode)
        .save();
    StructType schema = data.schema();
    return new BaseRelation() {
      @Override
      public SQLContext sqlContext() {
        return sqlContext;
      }

      @Override
      public StructType schema() {
        return schema;
      }
    };
  }

  @Override
  public Sink createSink(
      SQLContext sqlContext,
      scala.collection.immutable.Map<String, String> parameters,
      scala.collection.immutable.Seq<String> partitionColumns,
      OutputMode outputMode) {
    PythonSink.check(sqlContext.sparkSession());
    return new PythonSink(javaMap(parameters));
  }
}
