package io.materializer.localfs;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's raw local file system, its permissions set and its links read in this process.
 *
 * <p>Without the native library (pyspark ships none), {@code RawLocalFileSystem} sets a
 * permission by running {@code chmod} in a child process, and it sets one on every file and
 * folder it creates: a fork per checkpoint, Delta log and Parquet file, and a child that a
 * stop signal sent to the run's whole process group (a terminal's Ctrl-C, systemd's
 * control-group stop) kills first, failing the write the run was about to finish with.
 *
 * <p>It also runs {@code readlink} for each side of every rename, to learn whether a path is
 * a symbolic link: twice per checkpoint file a streaming query commits, so sixteen maps' Delta
 * queries forked a dozen times a second from a JVM of over a gigabyte.
 */
public class NioRawLocalFileSystem extends RawLocalFileSystem {
  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE,
    PosixFilePermission.OTHERS_READ, PosixFilePermission.GROUP_EXECUTE,
    PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE,
    PosixFilePermission.OWNER_READ,
  };

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    Files.setPosixFilePermissions(pathToFile(p).toPath(), posix(permission.toShort()));
  }

  /**
   * A path's status, not following a link: asked of the file itself unless it is a symbolic
   * link, which Hadoop's own code still reads (the checkpoints and tables hold none).
   */
  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    if (Files.isSymbolicLink(pathToFile(f).toPath())) {
      return super.getFileLinkStatus(f);
    }
    return getFileStatus(f);
  }

  /** The nine permission bits of {@code mode} (the sticky bit is not a file's to carry). */
  static Set<PosixFilePermission> posix(short mode) {
    Set<PosixFilePermission> out = EnumSet.noneOf(PosixFilePermission.class);
    for (int bit = 0; bit < BITS.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        out.add(BITS[bit]);
      }
    }
    return out;
  }
}
