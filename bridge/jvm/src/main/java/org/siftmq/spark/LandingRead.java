package org.siftmq.spark;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * One read of the landing zone: its record kind, landing zones, schema and the options handed to
 * Spark's Parquet source. The kinds' schemas come from {@code schemas.properties} in this jar,
 * generated at build time from {@code bridge/_schema.py} (the one source of truth).
 */
final class LandingRead {
  /** Options of ours, not handed to the Parquet source. */
  private static final Set<String> OURS =
      Set.of("kind", "path", "paths", "columns", "minpartitions", "maxpartitionbytes", "pushfilters");

  private static final Map<String, StructType> SCHEMAS = loadSchemas();

  final String kind;
  final List<String> landings;
  final StructType schema;
  /** Options for the Parquet source (the user's other options, and our file filter). */
  final Map<String, String> parquetOptions;

  private LandingRead(String kind, List<String> landings, StructType schema, Map<String, String> parquet) {
    this.kind = kind;
    this.landings = landings;
    this.schema = schema;
    this.parquetOptions = parquet;
  }

  private static Map<String, StructType> loadSchemas() {
    Properties p = new Properties();
    try (InputStream in = LandingRead.class.getResourceAsStream("schemas.properties")) {
      if (in == null) {
        throw new IllegalStateException("siftmq source: schemas.properties missing from the jar");
      }
      p.load(in);
    } catch (IOException e) {
      throw new IllegalStateException("siftmq source: cannot read schemas.properties", e);
    }
    Map<String, StructType> out = new TreeMap<>();
    for (String k : p.stringPropertyNames()) {
      out.put(k, StructType.fromDDL(p.getProperty(k)));
    }
    return out;
  }

  /** The documented schema of {@code kind} (every column nullable). */
  static StructType kindSchema(String kind) {
    StructType s = kind == null ? null : SCHEMAS.get(kind);
    if (s == null) {
      String names = String.join(", ", SCHEMAS.keySet());
      throw new IllegalArgumentException(kind == null
          ? "siftmq source: option 'kind' is required (one of " + names + ")"
          : "siftmq source: option kind='" + kind + "' is not a record kind (one of " + names + ")");
    }
    return s;
  }

  static Map<String, String> lower(Map<String, String> options) {
    Map<String, String> out = new LinkedHashMap<>();
    options.forEach((k, v) -> out.put(k.toLowerCase(Locale.ROOT), v));
    return out;
  }

  /** The read that {@code options} (any case) and a schema given by the user (or null) ask for. */
  static LandingRead of(Map<String, String> options, StructType given, boolean needPaths) {
    Map<String, String> o = lower(options);
    String kind = o.get("kind");
    StructType full = kindSchema(kind);
    StructType schema = subset(kind, full, columns(o), given);
    List<String> landings = landings(o, needPaths);
    Map<String, String> parquet = new HashMap<>();
    options.forEach((k, v) -> {
      if (!OURS.contains(k.toLowerCase(Locale.ROOT))) {
        parquet.put(k, v);
      }
    });
    // the bridge's files: dot and underscore files (its temporaries) are ignored by Spark's
    // listing, and anything not named *.parquet is not ours
    parquet.putIfAbsent("pathGlobFilter", "*.parquet");
    return new LandingRead(kind, landings, schema, parquet);
  }

  private static List<String> columns(Map<String, String> o) {
    String raw = o.get("columns");
    if (raw == null) {
      return null;
    }
    List<String> out = new ArrayList<>();
    for (String c : raw.split(",")) {
      if (!c.trim().isEmpty()) {
        out.add(c.trim());
      }
    }
    return out;
  }

  private static StructType subset(String kind, StructType full, List<String> columns, StructType given) {
    List<String> names = Arrays.asList(full.fieldNames());
    if (given != null) {
      List<String> want = Arrays.asList(given.fieldNames());
      if (columns != null && !columns.equals(want)) {
        throw new IllegalArgumentException("siftmq source: the schema given (" + String.join(", ", want)
            + ") is not option columns='" + String.join(",", columns)
            + "': give one of the two, or the same columns");
      }
      List<StructField> fields = new ArrayList<>();
      for (StructField f : given.fields()) {
        if (!names.contains(f.name())) {
          throw unknown(kind, names, List.of(f.name()));
        }
        StructField have = full.apply(f.name());
        if (!have.dataType().equals(f.dataType())) {
          throw new IllegalArgumentException("siftmq source: column " + f.name() + " of " + kind + " is "
              + have.dataType().simpleString() + ", not " + f.dataType().simpleString() + " (schema given)");
        }
        fields.add(have);
      }
      return new StructType(fields.toArray(new StructField[0]));
    }
    if (columns == null) {
      return full;
    }
    List<String> missing = new ArrayList<>();
    List<StructField> fields = new ArrayList<>();
    for (String c : columns) {
      if (names.contains(c)) {
        fields.add(full.apply(c));
      } else {
        missing.add(c);
      }
    }
    if (!missing.isEmpty() || columns.isEmpty()) {
      throw unknown(kind, names, missing);
    }
    return new StructType(fields.toArray(new StructField[0]));
  }

  private static IllegalArgumentException unknown(String kind, List<String> names, List<String> missing) {
    return new IllegalArgumentException("siftmq source: columns " + (missing.isEmpty() ? "empty" : String.join(", ", missing))
        + " (columns of " + kind + ": " + String.join(", ", names) + ")");
  }

  private static List<String> landings(Map<String, String> o, boolean needPaths) {
    List<String> out = new ArrayList<>();
    if (o.containsKey("paths")) {
      try {
        JsonNode node = new ObjectMapper().readTree(o.get("paths"));
        if (node.isArray()) {
          node.forEach(n -> out.add(n.asText()));
        } else {
          out.add(node.asText());
        }
      } catch (IOException e) {
        throw new IllegalArgumentException("siftmq source: option paths is not a JSON list of landing zones: "
            + o.get("paths"), e);
      }
    } else if (o.containsKey("path")) {
      out.add(o.get("path"));
    } else if (needPaths) {
      throw new IllegalArgumentException(
          "siftmq source: no landing zone: use load(LANDING) or load([LANDING, ...])");
    }
    List<String> abs = new ArrayList<>();
    for (String p : out) {
      String q = p.endsWith("/") && p.length() > 1 ? p.substring(0, p.length() - 1) : p;
      abs.add(q.contains("://") || q.startsWith("file:") ? q : new File(q).getAbsolutePath());
    }
    return abs;
  }

  /** The kind's directory in each landing zone that exists now (a missing one has no files). */
  List<String> existingKindDirs(Configuration conf) {
    List<String> out = new ArrayList<>();
    for (String landing : landings) {
      Path dir = new Path(landing, kind);
      try {
        FileSystem fs = dir.getFileSystem(conf);
        if (fs.exists(dir)) {
          out.add(dir.toString());
        }
      } catch (IOException e) {
        throw new IllegalArgumentException("siftmq source: cannot read landing zone " + landing + ": " + e, e);
      }
    }
    return out;
  }

  /**
   * One Hadoop glob for the kind's directory in every landing zone, {@code PREFIX/{a,b}/KIND}: a
   * file stream source takes one path, a glob is listed again at every trigger (a directory made
   * later is found) and is not required to exist.
   */
  String kindGlob() {
    if (landings.size() == 1) {
      String l = landings.get(0);
      return escape(l) + "/{" + escape(kind) + "}";
    }
    // the longest common prefix ending at a slash; the rest as alternatives
    String first = landings.get(0);
    int cut = first.length();
    for (String l : landings) {
      int i = 0;
      while (i < Math.min(cut, l.length()) && l.charAt(i) == first.charAt(i)) {
        i++;
      }
      cut = i;
    }
    cut = first.lastIndexOf('/', Math.max(cut - 1, 0));
    if (cut < 0 || first.substring(0, cut + 1).endsWith("://")) {
      throw new IllegalArgumentException("siftmq source: a stream over several landing zones needs them on one "
          + "file system (" + String.join(", ", landings) + ")");
    }
    StringBuilder b = new StringBuilder(escape(first.substring(0, cut))).append("/{");
    for (int i = 0; i < landings.size(); i++) {
      b.append(i > 0 ? "," : "").append(escape(landings.get(i).substring(cut + 1)).replace(",", "\\,"));
    }
    return b.append("}/").append(escape(kind)).toString();
  }

  private static String escape(String s) {
    StringBuilder b = new StringBuilder();
    for (char c : s.toCharArray()) {
      if ("\\{}[]*?".indexOf(c) >= 0) {
        b.append('\\');
      }
      b.append(c);
    }
    return b.toString();
  }
}
