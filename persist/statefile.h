/* statefile.h - the state directory's files and directories, trusted only
 * once checked: the daemon's own (its uid), writable by nobody else, never
 * a symlink, never a FIFO or device.  Whoever else could write there could
 * plant a session for a tenant to resume; a FIFO at a snapshot's path would
 * hang the I/O thread and the daemon's stop. */
#ifndef CKV_PERSIST_STATEFILE_H
#define CKV_PERSIST_STATEFILE_H

#include <stddef.h>

/* The state directory is the daemon's alone: when it exists, a directory
 * of the daemon's user that its group and others cannot write (anyone who
 * could would plant sessions in it).  CKV_OK, or CKV_ERR_AUTH (or -errno)
 * with err: the daemon refuses to start. */
int ckv_statefile_check_root(const char *state_dir, char *err, size_t errlen);
/* A file of the state directory, before it is read: the file a regular
 * file of the daemon's that group and others cannot write (a symlink, FIFO
 * or device refused), and its `parents` directories above it (a tenant's,
 * an area) real directories of the daemon's.  CKV_OK; -ENOENT (no file);
 * CKV_ERR_AUTH (not the daemon's, a symlink); CKV_ERR_CORRUPT (not a
 * regular file); or -errno; err says.  The reader still opens it without
 * following a symlink or blocking (snapshot.c). */
int ckv_statefile_check_file(const char *path, unsigned parents, char *err, size_t errlen);

/* A directory below the state directory (an area, a tenant's): a real
 * directory (never a symlink), the daemon's, writable by it alone.  CKV_OK,
 * -ENOENT, -ENOTDIR, or CKV_ERR_AUTH (a symlink, not the daemon's) with err. */
int ckv_statefile_check_dir(const char *path, char *err, size_t errlen);

#endif
