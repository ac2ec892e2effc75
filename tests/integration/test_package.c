/* test_package.c - the .deb, end to end.
 *
 * Builds the package once from this build tree (cpack -G DEB into a temporary
 * directory, CPACK_PACKAGING_INSTALL_PREFIX=/usr; or takes $CKV_DEB), then:
 * `dpkg-deb -c` lists every file the package promises; the control files
 * (conffiles, maintainer scripts) are there; `dpkg --root` installs it into a
 * scratch root (an empty dpkg database there, maintainer scripts run
 * chrootless inside that root: the commitkv user lands in ROOT/etc/passwd);
 * a small C program built with the installed pkg-config file (PKG_CONFIG_PATH
 * and PKG_CONFIG_SYSROOT_DIR pointing into the scratch root) links against the
 * installed libcommitkv.so.0 and connects to a running commitkvd
 * (ckv_client_connect + ckv_client_heartbeat); the same program builds with
 * find_package(CommitKV).  When the Python module is built, the same cpack
 * run makes python3-commitkv: its files and control fields are checked, it is
 * installed into the same root, and Debian's /usr/bin/python3, in an empty
 * environment that sees nothing of this build tree, imports commitkv from
 * there and prints commitkv.__version__.  Skipped, visibly, where dpkg-deb or
 * cpack is missing. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static int sh(const char *cmd) {
  int r = system(cmd);
  if (r == -1 || !WIFEXITED(r)) return -1;
  return WEXITSTATUS(r);
}

/* Runs cmd and returns its stdout (malloc'd) or NULL when it failed. */
static char *sh_out(const char *cmd) {
  FILE *p = popen(cmd, "r");
  if (!p) return NULL;
  size_t cap = 1 << 16, len = 0, got;
  char *buf = malloc(cap);
  while (buf && (got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
    len += got;
    if (cap - len < 2) {
      char *nb = realloc(buf, cap * 2);
      if (!nb) break;
      buf = nb;
      cap *= 2;
    }
  }
  int rc = pclose(p);
  if (!buf || rc != 0) {
    free(buf);
    return NULL;
  }
  buf[len] = 0;
  return buf;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "cannot write %s", path);
  fputs(text, f);
  fclose(f);
}

static const char k_worker_c[] =
    "/* built against the installed package only */\n"
    "#define _GNU_SOURCE\n"
    "#include <dlfcn.h>\n"
    "#include <stdio.h>\n"
    "#include <commitkv/commitkv.h>\n"
    "int main(int argc, char **argv) {\n"
    "  if (argc != 3) return 2;\n"
    "  ckv_client_options o = {.socket = argv[1], .attach_socket = argv[2], .name = \"pkgtest\",\n"
    "                          .no_arenas = true, .timeout_ms = 5000};\n"
    "  ckv_client *c;\n"
    "  int r = ckv_client_connect(&o, &c);\n"
    "  if (r < 0) { fprintf(stderr, \"connect: %s\\n\", ckv_strerror(r)); return 1; }\n"
    "  r = ckv_client_heartbeat(c);\n"
    "  if (r < 0) { fprintf(stderr, \"heartbeat: %s\\n\", ckv_strerror(r)); return 1; }\n"
    "  Dl_info info;\n"
    "  if (dladdr((void *)ckv_client_connect, &info)) printf(\"library %s\\n\", info.dli_fname);\n"
    "  printf(\"tenant %s\\n\", ckv_client_tenant(c));\n"
    "  ckv_client_free(c);\n"
    "  return 0;\n"
    "}\n";

/* The python3-commitkv package beside `deb` (the commitkv package): listed,
 * installed into root, imported by /usr/bin/python3 with nothing of the build
 * tree in sight. */
static void check_python_package(const char *deb, const char *root, const char *dir, bool via_dpkg) {
  char cmd[8192], pydir[1024];
  snprintf(pydir, sizeof(pydir), "%s/../python/commitkv", ckv_test_bin_dir());
  bool built = access(pydir, F_OK) == 0;
  char out_dir[1024];
  snprintf(out_dir, sizeof(out_dir), "%s", deb);
  char *slash = strrchr(out_dir, '/');
  if (slash) *slash = 0;
  snprintf(cmd, sizeof(cmd), "ls %s/python3-commitkv_*.deb 2>/dev/null", slash ? out_dir : ".");
  char *found = sh_out(cmd);
  if (found) found[strcspn(found, "\n")] = 0;
  if (!found || !*found) {
    free(found);
    cr_expect(!built, "the Python module is built (%s) but no python3-commitkv package was made beside %s", pydir, deb);
    if (!built) cr_log_warn("no Python module in this build: python3-commitkv is NOT checked");
    return;
  }
  char pydeb[1024];
  snprintf(pydeb, sizeof(pydeb), "%s", found);
  free(found);
  cr_log_info("package %s", pydeb);

  snprintf(cmd, sizeof(cmd), "dpkg-deb -c %s", pydeb);
  char *list = sh_out(cmd);
  cr_assert_not_null(list, "dpkg-deb -c %s failed", pydeb);
  const char *want[] = {"./usr/lib/python3/dist-packages/commitkv/__init__.py",
                        "./usr/lib/python3/dist-packages/commitkv/__init__.pyi",
                        "./usr/lib/python3/dist-packages/commitkv/_errors.py",
                        "./usr/lib/python3/dist-packages/commitkv/py.typed",
                        "./usr/lib/python3/dist-packages/commitkv/_commitkv.cpython-"};
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
    cr_expect(strstr(list, want[i]) != NULL, "python3-commitkv lacks %s:\n%s", want[i], list);
  cr_expect(strstr(list, "/usr/bin/") == NULL && strstr(list, "/etc/") == NULL,
            "python3-commitkv carries files of the commitkv package:\n%s", list);
  free(list);
  snprintf(cmd, sizeof(cmd), "dpkg-deb -f %s Package Depends", pydeb);
  char *fields = sh_out(cmd);
  cr_assert_not_null(fields);
  cr_expect(strstr(fields, "Package: python3-commitkv") != NULL, "%s", fields);
  cr_expect(strstr(fields, "python3 (>= ") && strstr(fields, "python3-numpy") && strstr(fields, "libzmq5"),
            "python3-commitkv depends on python3, python3-numpy and libzmq5: %s", fields);
  free(fields);
  snprintf(cmd, sizeof(cmd), "dpkg-deb -e %s %s/pycontrol && ls %s/pycontrol", pydeb, dir, dir);
  char *ctl = sh_out(cmd);
  cr_expect(ctl && !strstr(ctl, "postinst") && !strstr(ctl, "conffiles"), "python3-commitkv has commitkv's scripts: %s",
            ctl ? ctl : "(none)");
  free(ctl);

  if (via_dpkg) {
    snprintf(cmd, sizeof(cmd),
             "dpkg --root=%s --force-script-chrootless --force-depends --force-not-root --log=/dev/null -i %s "
             ">%s/dpkg-python.log 2>&1 && dpkg --root=%s -s python3-commitkv | grep -q '^Status: install ok installed'",
             root, pydeb, dir, root);
    cr_expect_eq(sh(cmd), 0, "dpkg --root did not install python3-commitkv (see %s/dpkg-python.log)", dir);
  } else {
    snprintf(cmd, sizeof(cmd), "dpkg-deb -x %s %s", pydeb, root);
    cr_assert_eq(sh(cmd), 0, "%s", cmd);
  }
  /* A sanitizer build packages an instrumented extension: python3 must load the runtimes first. */
  snprintf(cmd, sizeof(cmd), "objdump -p %s/usr/lib/python3/dist-packages/commitkv/_commitkv.cpython-*.so | grep NEEDED",
           root);
  char *needed = sh_out(cmd);
  char preload[600] = "";
  if (needed && strstr(needed, "libasan")) {
    char *asan = sh_out("cc -print-file-name=libasan.so"), *ubsan = sh_out("cc -print-file-name=libubsan.so");
    if (asan && ubsan) {
      asan[strcspn(asan, "\n")] = 0;
      ubsan[strcspn(ubsan, "\n")] = 0;
      snprintf(preload, sizeof(preload), "LD_PRELOAD=%s:%s ASAN_OPTIONS=detect_leaks=0", asan, ubsan);
    }
    free(asan);
    free(ubsan);
  }
  free(needed);
  /* env -i: no PYTHONPATH into the build tree; -s: no user site; run from an
   * empty directory so nothing beside it is imported instead. */
  snprintf(cmd, sizeof(cmd),
           "mkdir -p %s/empty && cd %s/empty && env -i PATH=/usr/bin:/bin %s /usr/bin/python3 -s -c "
           "\"import sys; sys.path.insert(0, '%s/usr/lib/python3/dist-packages'); import commitkv; "
           "print(commitkv.__version__); print(commitkv.__file__); print(commitkv.connect.__doc__ is not None)\" 2>&1",
           dir, dir, preload, root);
  char *out = sh_out(cmd);
  cr_assert_not_null(out, "the installed module does not import: %s", cmd);
  char want_file[900];
  snprintf(want_file, sizeof(want_file), "%s/usr/lib/python3/dist-packages/commitkv/__init__.py", root);
  cr_expect(strncmp(out, CKV_VERSION_STRING "\n", strlen(CKV_VERSION_STRING) + 1) == 0,
            "commitkv.__version__ is not %s:\n%s", CKV_VERSION_STRING, out);
  cr_expect(strstr(out, want_file) != NULL, "not the installed module:\n%s", out);
  cr_expect(strstr(out, "True") != NULL, "%s", out);
  cr_log_info("python3 -c 'import commitkv; print(commitkv.__version__)' from the package: %.*s",
              (int)strcspn(out, "\n"), out);
  free(out);
}

Test(package, deb_lists_installs_links_and_connects, .timeout = 240) {
  if (sh("command -v dpkg-deb >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1") != 0)
    cr_skip_test("dpkg-deb not installed: the .deb is NOT checked");
  char *dir = ckv_test_tmpdir("ckv-pkg");
  char cmd[8192], deb[1024], root[700];
  long long t0 = ckv_test_now_ms();

  /* 1. The package: $CKV_DEB, or cpack on this build tree. */
  const char *env = getenv("CKV_DEB");
  if (env && *env) {
    snprintf(deb, sizeof(deb), "%s", env);
  } else {
    if (sh("command -v cpack >/dev/null 2>&1") != 0) cr_skip_test("cpack not installed: the .deb is NOT checked");
    snprintf(cmd, sizeof(cmd),
             "cd %s/.. && cpack --config CPackConfig.cmake -G DEB -B %s/out -D CPACK_PACKAGING_INSTALL_PREFIX=/usr "
             ">%s/cpack.log 2>&1 && ls %s/out/commitkv_*.deb",
             ckv_test_bin_dir(), dir, dir, dir);
    char *found = sh_out(cmd);
    cr_assert_not_null(found, "cpack failed; see %s/cpack.log", dir);
    found[strcspn(found, "\n")] = 0;
    snprintf(deb, sizeof(deb), "%s", found);
    free(found);
  }
  cr_log_info("package %s (%lld ms)", deb, ckv_test_now_ms() - t0);

  /* 2. Its contents. */
  char *arch = sh_out("dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch");
  cr_assert_not_null(arch);
  arch[strcspn(arch, "\n")] = 0;
  snprintf(cmd, sizeof(cmd), "dpkg-deb -c %s", deb);
  char *list = sh_out(cmd);
  cr_assert_not_null(list, "dpkg-deb -c %s failed", deb);
  char libdir[256];
  snprintf(libdir, sizeof(libdir), "./usr/lib/%s", arch);
  const char *want[] = {"./usr/bin/commitkvd",
                        "./usr/bin/commitkvctl",
                        "/libcommitkv.so.0.1.0",
                        "/libcommitkv.so.0 -> libcommitkv.so.0.1.0",
                        "/libcommitkv.so -> libcommitkv.so.0",
                        "./usr/include/commitkv/commitkv.h",
                        "./usr/include/commitkv/status.h",
                        "/pkgconfig/commitkv.pc",
                        "/cmake/CommitKV/CommitKVConfig.cmake",
                        "/cmake/CommitKV/CommitKVConfigVersion.cmake",
                        "/cmake/CommitKV/CommitKVTargets.cmake",
                        "./usr/lib/systemd/system/commitkvd.service",
                        "./usr/lib/systemd/system/commitkvd-attach.socket",
                        "./usr/lib/sysusers.d/commitkv.conf",
                        "./usr/lib/tmpfiles.d/commitkv.conf",
                        "./etc/commitkv/commitkvd.conf",
                        "./usr/share/man/man8/commitkvd.8.gz",
                        "./usr/share/man/man1/commitkvctl.1.gz",
                        "./usr/share/man/man5/commitkvd.conf.5.gz"};
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    char full[512];
    /* library files live in the multiarch directory */
    if (want[i][0] == '/')
      snprintf(full, sizeof(full), "%s%s", libdir, want[i]);
    else
      snprintf(full, sizeof(full), "%s", want[i]);
    cr_expect(strstr(list, full) != NULL, "the package lacks %s:\n%s", full, list);
  }
  free(list);
  snprintf(cmd, sizeof(cmd), "dpkg-deb -e %s %s/control && cat %s/control/conffiles", deb, dir, dir);
  char *conffiles = sh_out(cmd);
  cr_expect(conffiles && strstr(conffiles, "/etc/commitkv/commitkvd.conf"), "not a conffile: %s",
            conffiles ? conffiles : "(no conffiles)");
  free(conffiles);
  for (const char *const *s = (const char *const[]){"postinst", "prerm", "postrm", "shlibs", "triggers", NULL}; *s;
       s++) {
    char p[900];
    snprintf(p, sizeof(p), "%s/control/%s", dir, *s);
    cr_expect_eq(access(p, R_OK), 0, "no %s in the control archive", *s);
  }

  /* 3. Install into a scratch root. */
  snprintf(root, sizeof(root), "%s/root", dir);
  snprintf(cmd, sizeof(cmd),
           "mkdir -p %s/var/lib/dpkg/info %s/var/lib/dpkg/updates %s/var/lib/dpkg/triggers && "
           "touch %s/var/lib/dpkg/status %s/var/lib/dpkg/available && "
           "dpkg --root=%s --force-script-chrootless --force-depends --force-not-root --log=/dev/null -i %s "
           ">%s/dpkg.log 2>&1",
           root, root, root, root, root, root, deb, dir);
  bool via_dpkg = sh(cmd) == 0;
  if (via_dpkg) {
    snprintf(cmd, sizeof(cmd), "dpkg --root=%s -s commitkv | grep -q '^Status: install ok installed'", root);
    cr_expect_eq(sh(cmd), 0, "dpkg --root does not list commitkv as installed");
    snprintf(cmd, sizeof(cmd), "grep -q '^commitkv:' %s/etc/passwd", root);
    if (sh(cmd) != 0) cr_log_warn("postinst did not create the commitkv user inside the scratch root");
  } else {
    /* dpkg --root needs privileges some sandboxes lack: unpack instead. */
    cr_log_warn("dpkg --root failed (see %s/dpkg.log); falling back to dpkg-deb -x", dir);
    snprintf(cmd, sizeof(cmd), "rm -rf %s && dpkg-deb -x %s %s", root, deb, root);
    cr_assert_eq(sh(cmd), 0, "%s", cmd);
  }
  char so[900];
  snprintf(so, sizeof(so), "%s/usr/lib/%s/libcommitkv.so.0", root, arch);
  cr_assert_eq(access(so, R_OK), 0, "not installed: %s", so);
  snprintf(cmd, sizeof(cmd), "objdump -p %s | grep -q 'SONAME *libcommitkv.so.0$'", so);
  if (sh("command -v objdump >/dev/null 2>&1") == 0) cr_expect_eq(sh(cmd), 0, "SONAME of %s is not libcommitkv.so.0", so);

  /* A sanitizer build packages an instrumented library: the program that
   * loads it must carry the same runtime first. */
  snprintf(cmd, sizeof(cmd), "objdump -p %s 2>/dev/null | grep NEEDED", so);
  char *needed = sh_out(cmd);
  const char *san = needed && strstr(needed, "libasan") ? "-fsanitize=address,undefined" : "";
  free(needed);

  /* 4. A worker built from the installed pkg-config file alone. */
  char src[800], bin[800], pcenv[2000];
  snprintf(src, sizeof(src), "%s/worker.c", dir);
  snprintf(bin, sizeof(bin), "%s/worker", dir);
  write_file(src, k_worker_c);
  snprintf(pcenv, sizeof(pcenv), "PKG_CONFIG_LIBDIR=%s/usr/lib/%s/pkgconfig PKG_CONFIG_PATH= PKG_CONFIG_SYSROOT_DIR=%s",
           root, arch, root);
  snprintf(cmd, sizeof(cmd), "%s pkg-config --cflags --libs commitkv", pcenv);
  char *flags = sh_out(cmd);
  cr_assert_not_null(flags, "pkg-config does not find commitkv in the scratch root");
  flags[strcspn(flags, "\n")] = 0;
  cr_expect(strstr(flags, root) != NULL, "pkg-config flags do not point into the scratch root: %s", flags);
  cr_expect(strstr(flags, "-lcommitkv") != NULL, "%s", flags);
  snprintf(cmd, sizeof(cmd), "cc -std=c11 -Wall -Werror %s -o %s %s %s >%s/cc.log 2>&1", san, bin, src, flags, dir);
  free(flags);
  cr_assert_eq(sh(cmd), 0, "the worker does not build against the package: %s (see %s/cc.log)", cmd, dir);

  ckv_test_daemon d;
  cr_assert_eq(ckv_test_daemon_start(&d, NULL), 0, "commitkvd did not start");
  snprintf(cmd, sizeof(cmd), "LD_LIBRARY_PATH=%s/usr/lib/%s %s %s %s", root, arch, bin, d.socket, d.attach);
  char *out = sh_out(cmd);
  cr_expect_not_null(out, "the packaged worker could not connect: %s", cmd);
  if (out) {
    char want_lib[900];
    snprintf(want_lib, sizeof(want_lib), "library %s/usr/lib/%s/libcommitkv.so.0", root, arch);
    cr_expect(strstr(out, want_lib) != NULL, "not the installed library:\n%s", out);
    cr_expect(strstr(out, "tenant ") != NULL, "%s", out);
  }
  free(out);

  /* 5. find_package(CommitKV) against the same root. */
  if (sh("command -v cmake >/dev/null 2>&1") == 0) {
    char proj[800];
    snprintf(proj, sizeof(proj), "%s/cmk/CMakeLists.txt", dir);
    snprintf(cmd, sizeof(cmd), "mkdir -p %s/cmk && cp %s %s/cmk/worker.c", dir, src, dir);
    cr_assert_eq(sh(cmd), 0);
    write_file(proj, "cmake_minimum_required(VERSION 3.16)\nproject(pkgworker C)\n"
                     "find_package(CommitKV 0.1 REQUIRED)\n"
                     "add_executable(worker worker.c)\ntarget_link_libraries(worker PRIVATE CommitKV::commitkv)\n");
    snprintf(cmd, sizeof(cmd),
             "cmake -S %s/cmk -B %s/cmk/build -DCMAKE_PREFIX_PATH=%s/usr '-DCMAKE_C_FLAGS=%s' >%s/cmake.log 2>&1 && "
             "cmake --build %s/cmk/build >>%s/cmake.log 2>&1 && "
             "LD_LIBRARY_PATH=%s/usr/lib/%s %s/cmk/build/worker %s %s >>%s/cmake.log 2>&1",
             dir, dir, root, san, dir, dir, dir, root, arch, dir, d.socket, d.attach, dir);
    cr_expect_eq(sh(cmd), 0, "find_package(CommitKV) build or run failed (see %s/cmake.log)", dir);
  }
  cr_expect_eq(ckv_test_daemon_stop(&d), 0);

  /* 6. python3-commitkv, when this tree builds the module. */
  check_python_package(deb, root, dir, via_dpkg);

  /* The packaged daemon runs (it needs nothing from the package but itself). */
  snprintf(cmd, sizeof(cmd), "%s/usr/bin/commitkvd --version", root);
  char *ver = sh_out(cmd);
  cr_expect(ver && strstr(ver, "commitkvd "), "packaged commitkvd --version: %s", ver ? ver : "(failed)");
  free(ver);
  free(arch);
  cr_log_info("package test took %lld ms (%s)", ckv_test_now_ms() - t0, via_dpkg ? "dpkg --root" : "dpkg-deb -x");
  if (!getenv("CKV_KEEP_TMP")) ckv_test_rmdir(dir);
}
