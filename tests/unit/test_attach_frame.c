/* test_attach_frame.c - the non-blocking attach frame reader (daemon/attach_frame.c)
 * over a real socketpair: frames that arrive a byte at a time, oversized
 * lengths, hang-ups, descriptors that ride along, frames queued back to back. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commitkv/status.h"
#include "daemon/attach_frame.h"
#include "shm/fdpass.h"

static int sv[2]; /* sv[0]: the daemon's end (non-blocking), sv[1]: the peer's */

static void setup(void) {
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  cr_assert_eq(fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK), 0);
}

static void teardown(void) {
  close(sv[0]);
  if (sv[1] >= 0) close(sv[1]);
}

TestSuite(attach_frame, .init = setup, .fini = teardown);

static void put(const void *p, size_t n) { cr_assert_eq(send(sv[1], p, n, MSG_NOSIGNAL), (ssize_t)n); }

static void put_len(uint32_t v) {
  uint8_t h[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  put(h, 4);
}

Test(attach_frame, byte_by_byte_then_complete) {
  ckv_attach_frame f;
  ckv_attach_frame_init(&f);
  cr_assert_eq(ckv_attach_frame_read(&f, sv[0], 64), CKV_ATTACH_FRAME_MORE);
  cr_assert_not(ckv_attach_frame_started(&f));
  uint8_t h[4] = {5, 0, 0, 0};
  for (int i = 0; i < 4; i++) {
    put(&h[i], 1);
    cr_assert_eq(ckv_attach_frame_read(&f, sv[0], 64), CKV_ATTACH_FRAME_MORE);
    cr_assert(ckv_attach_frame_started(&f));
  }
  const char *body = "hello";
  for (int i = 0; i < 4; i++) {
    put(body + i, 1);
    cr_assert_eq(ckv_attach_frame_read(&f, sv[0], 64), CKV_ATTACH_FRAME_MORE);
  }
  put(body + 4, 1);
  cr_assert_eq(ckv_attach_frame_read(&f, sv[0], 64), CKV_OK);
  cr_assert_eq(f.len, 5u);
  cr_assert_eq(memcmp(f.body, "hello", 5), 0);
  ckv_attach_frame_done(&f);
  cr_assert_not(ckv_attach_frame_started(&f));
}

Test(attach_frame, reads_no_further_than_its_frame) {
  cr_assert_eq(ckv_frame_send(sv[1], "one", 3, NULL, 0), CKV_OK);
  cr_assert_eq(ckv_frame_send(sv[1], "", 0, NULL, 0), CKV_OK);
  cr_assert_eq(ckv_frame_send(sv[1], "three", 5, NULL, 0), CKV_OK);
  ckv_attach_frame f;
  ckv_attach_frame_init(&f);
  cr_assert_eq(ckv_attach_frame_read(&f, sv[0], 64), CKV_OK);
  cr_assert_eq(f.len, 3u);
  cr_assert_eq(memcmp(f.body, "one", 3), 0);
  ckv_attach_frame_done(&f);
  cr_assert_eq(ckv_attach_frame_read(&f, sv[0], 64), CKV_OK);
  cr_assert_eq(f.len, 0u);
  cr_assert_null(f.body);
  ckv_attach_frame_done(&f);
  cr_assert_eq(ckv_attach_frame_read(&f, sv[0], 64), CKV_OK);
  cr_assert_eq(f.len, 5u);
  cr_assert_eq(memcmp(f.body, "three", 5), 0);
  ckv_attach_frame_done(&f);
  cr_assert_eq(ckv_attach_frame_read(&f, sv[0], 64), CKV_ATTACH_FRAME_MORE);
}

Test(attach_frame, oversized_length_is_refused_unread) {
  put_len(65);
  put("x", 1);
  ckv_attach_frame f;
  ckv_attach_frame_init(&f);
  cr_assert_eq(ckv_attach_frame_read(&f, sv[0], 64), CKV_ERR_TOO_LARGE);
  cr_assert_null(f.body, "nothing is buffered for a frame that is refused");
  char b;
  cr_assert_eq(recv(sv[0], &b, 1, MSG_DONTWAIT), 1, "the payload was left on the socket");
  ckv_attach_frame_done(&f);
}

Test(attach_frame, hang_up_before_and_inside_a_frame) {
  ckv_attach_frame f;
  ckv_attach_frame_init(&f);
  put_len(10);
  put("abc", 3);
  cr_assert_eq(ckv_attach_frame_read(&f, sv[0], 64), CKV_ATTACH_FRAME_MORE);
  close(sv[1]);
  sv[1] = -1;
  cr_assert_eq(ckv_attach_frame_read(&f, sv[0], 64), CKV_ERR_PROTO);
  ckv_attach_frame_done(&f);

  int p[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, p), 0);
  close(p[1]);
  cr_assert_eq(ckv_attach_frame_read(&f, p[0], 64), CKV_ERR_DISCONNECTED);
  ckv_attach_frame_done(&f);
  close(p[0]);
}

Test(attach_frame, descriptors_are_closed_and_the_frame_refused) {
  int passed = open("/dev/null", O_RDONLY | O_CLOEXEC);
  cr_assert_geq(passed, 0);
  cr_assert_eq(ckv_frame_send(sv[1], "abcd", 4, &passed, 1), CKV_OK);
  close(passed);
  /* The descriptor the kernel gives us lands on the lowest free number. */
  int probe = open("/dev/null", O_RDONLY | O_CLOEXEC);
  close(probe);
  ckv_attach_frame f;
  ckv_attach_frame_init(&f);
  cr_assert_eq(ckv_attach_frame_read(&f, sv[0], 64), CKV_ERR_PROTO);
  ckv_attach_frame_done(&f);
  struct stat st;
  cr_assert_eq(fstat(probe, &st), -1, "the passed descriptor was left open");
}
