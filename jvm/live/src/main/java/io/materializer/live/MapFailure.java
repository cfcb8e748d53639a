package io.materializer.live;

/**
 * A failure of one map's Redis call (its copy lost, its owner changed, a server away). The
 * message names the map in a form the run reads back ({@code materializer.run.live}), so
 * that the failure of the shared query is that map's alone: the others fold on.
 */
final class MapFailure extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** What precedes the map's name in the message. */
  static final String PREFIX = "MATERIALIZER_LIVE_MAP ";

  MapFailure(String map, Throwable cause) {
    super(PREFIX + map + " : " + cause.getMessage(), cause);
  }
}
