/* test_utf8.c - UTF-8 checking and repair (daemon/utf8.c).
 *
 * The oracle is written here independently of the module: a byte string is
 * valid exactly when it splits into sequences that decode by their bit
 * patterns to code points that encode back to the same bytes (no overlong
 * form), none a surrogate, none above U+10FFFF.  Every 1-, 2- and 3-byte
 * string is checked against it, 4-byte ones by a fixed random sample.  Then
 * cutting (prefix, trim) and repair (copy): the result is always valid,
 * keeps valid text whole and never ends inside a character. */
#include "daemon/utf8.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "testcheck.h"

TestSuite(utf8, .fini = ckv_test_leak_check);

/* Encodes code point c; returns the length (1..4). */
static size_t encode(uint32_t c, uint8_t *out) {
  if (c < 0x80) {
    out[0] = (uint8_t)c;
    return 1;
  }
  if (c < 0x800) {
    out[0] = (uint8_t)(0xC0 | c >> 6), out[1] = (uint8_t)(0x80 | (c & 63));
    return 2;
  }
  if (c < 0x10000) {
    out[0] = (uint8_t)(0xE0 | c >> 12), out[1] = (uint8_t)(0x80 | (c >> 6 & 63)), out[2] = (uint8_t)(0x80 | (c & 63));
    return 3;
  }
  out[0] = (uint8_t)(0xF0 | c >> 18), out[1] = (uint8_t)(0x80 | (c >> 12 & 63));
  out[2] = (uint8_t)(0x80 | (c >> 6 & 63)), out[3] = (uint8_t)(0x80 | (c & 63));
  return 4;
}

/* The oracle: length of the valid sequence at b[0..len), 0 when none. */
static size_t oracle_seq(const uint8_t *b, size_t len) {
  size_t n = b[0] < 0x80 ? 1 : (b[0] & 0xE0) == 0xC0 ? 2 : (b[0] & 0xF0) == 0xE0 ? 3 : (b[0] & 0xF8) == 0xF0 ? 4 : 0;
  if (!n || n > len) return 0;
  uint32_t c = n == 1 ? b[0] : (uint32_t)(b[0] & (0x7F >> n));
  for (size_t i = 1; i < n; i++) {
    if ((b[i] & 0xC0) != 0x80) return 0;
    c = c << 6 | (b[i] & 63);
  }
  if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
  uint8_t again[4];
  if (encode(c, again) != n || memcmp(again, b, n) != 0) return 0; /* overlong */
  return n;
}

static bool oracle_valid(const uint8_t *b, size_t len) {
  for (size_t i = 0; i < len;) {
    size_t n = oracle_seq(b + i, len - i);
    if (!n) return false;
    i += n;
  }
  return true;
}

Test(utf8, every_short_string_matches_the_oracle) {
  uint8_t b[4];
  size_t mismatches = 0;
  for (uint32_t v = 0; v < (1u << 24); v++) {
    b[0] = (uint8_t)(v >> 16), b[1] = (uint8_t)(v >> 8), b[2] = (uint8_t)v;
    for (size_t len = 1; len <= 3; len++) {
      if (len < 3 && (v & ((1u << (8 * (3 - len))) - 1))) continue; /* each shorter string once */
      bool want = oracle_valid(b, len), got = ckv_utf8_valid((const char *)b, len);
      if (want != got && mismatches++ < 5)
        cr_log_error("%02x %02x %02x (len %zu): oracle %d, module %d", b[0], b[1], b[2], len, want, got);
    }
  }
  cr_assert_eq(mismatches, 0, "%zu strings judged unlike the oracle", mismatches);
}

Test(utf8, four_byte_sample_matches_the_oracle) {
  uint64_t x = 0x9E3779B97F4A7C15ull;
  size_t mismatches = 0;
  for (int i = 0; i < 2000000; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    uint8_t b[4] = {(uint8_t)(0xF0 | (x & 7)), (uint8_t)(x >> 8), (uint8_t)(x >> 16), (uint8_t)(x >> 24)};
    if (i & 1) b[1] = (uint8_t)(0x80 | (b[1] & 0x3F)), b[2] = (uint8_t)(0x80 | (b[2] & 0x3F));
    if (i & 2) b[3] = (uint8_t)(0x80 | (b[3] & 0x3F));
    if (oracle_valid(b, 4) != ckv_utf8_valid((const char *)b, 4)) mismatches++;
  }
  cr_assert_eq(mismatches, 0);
  /* Every code point encodes to a valid sequence of its own length, except surrogates. */
  for (uint32_t c = 0; c <= 0x10FFFF; c++) {
    uint8_t b[4];
    size_t n = encode(c, b);
    size_t got = ckv_utf8_seq_len((const char *)b, n);
    if (c >= 0xD800 && c <= 0xDFFF)
      cr_assert_eq(got, 0, "surrogate U+%04X accepted", c);
    else
      cr_assert_eq(got, n, "U+%04X: length %zu, want %zu", c, got, n);
    if (n > 1) cr_assert_eq(ckv_utf8_seq_len((const char *)b, n - 1), 0, "U+%04X cut short accepted", c);
  }
}

Test(utf8, prefix_cuts_only_between_characters) {
  /* "é" is 2 bytes, "€" 3, "😀" 4: a 64-byte cut must not split them. */
  const char *s = "ab\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z";
  int want[] = {0, 1, 2, 2, 4, 4, 4, 7, 7, 7, 7, 11, 12, 12};
  for (size_t max = 0; max < sizeof(want) / sizeof(want[0]); max++)
    cr_assert_eq(ckv_utf8_prefix(s, max), want[max], "max %zu: %d, want %d", max, ckv_utf8_prefix(s, max), want[max]);
  /* Invalid bytes count one each (the repair replaces them). */
  cr_assert_eq(ckv_utf8_prefix("\xFF\xFE\x80x", 3), 3);
  cr_assert_eq(ckv_utf8_prefix("\xC3", 8), 1); /* a lone lead byte at the end of the text */
  /* A 64-byte cut of 40 copies of "é" stops at 64, of 30 copies of "€" at 63. */
  char e[81] = "", euro[91] = "";
  for (int i = 0; i < 40; i++) strcat(e, "\xC3\xA9");
  for (int i = 0; i < 30; i++) strcat(euro, "\xE2\x82\xAC");
  cr_assert_eq(ckv_utf8_prefix(e, 64), 64);
  cr_assert_eq(ckv_utf8_prefix(euro, 64), 63);
  char out[128];
  snprintf(out, sizeof(out), "'%.*s'", ckv_utf8_prefix(euro, 64), euro);
  cr_assert(ckv_utf8_valid(out, strlen(out)));
}

Test(utf8, trim_drops_an_incomplete_last_character) {
  char a[] = "x\xE2\x82", b[] = "x\xE2", c[] = "x\xF0\x9F\x98", d[] = "x\xE2\x82\xAC", e[] = "x\xC3\xA9", f[] = "";
  ckv_utf8_trim(a), ckv_utf8_trim(b), ckv_utf8_trim(c), ckv_utf8_trim(d), ckv_utf8_trim(e), ckv_utf8_trim(f);
  cr_assert_str_eq(a, "x");
  cr_assert_str_eq(b, "x");
  cr_assert_str_eq(c, "x");
  cr_assert_str_eq(d, "x\xE2\x82\xAC");
  cr_assert_str_eq(e, "x\xC3\xA9");
  cr_assert_str_eq(f, "");
  /* What snprintf leaves when it cuts "€€€" into 8 bytes: two whole signs. */
  char buf[8];
  memcpy(buf, "\xE2\x82\xAC\xE2\x82\xAC\xE2", 7);
  buf[7] = 0;
  ckv_utf8_trim(buf);
  cr_assert_str_eq(buf, "\xE2\x82\xAC\xE2\x82\xAC");
}

Test(utf8, copy_repairs_and_keeps_valid_text) {
  char out[64];
  const char *ok = "caf\xC3\xA9 \xE2\x82\xAC";
  cr_assert_eq(ckv_utf8_copy(out, sizeof(out), ok, strlen(ok)), strlen(ok));
  cr_assert_str_eq(out, ok);
  cr_assert_eq(ckv_utf8_copy_size(ok, strlen(ok)), strlen(ok) + 1);
  /* Each invalid byte becomes one U+FFFD: stray continuation, C0 overlong,
   * a surrogate's three bytes, a cut sequence. */
  const char *bad = "a\x80" "b\xC0\xAF" "c\xED\xA0\x80" "d\xE2\x82";
  size_t need = ckv_utf8_copy_size(bad, strlen(bad));
  cr_assert_eq(need, 4 + 8 * 3 + 1);
  size_t n = ckv_utf8_copy(out, sizeof(out), bad, strlen(bad));
  cr_assert_eq(n + 1, need);
  cr_assert_str_eq(out, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD" "c\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
                        "d\xEF\xBF\xBD\xEF\xBF\xBD");
  cr_assert(ckv_utf8_valid(out, n));
  /* An embedded NUL ends the text; a full buffer stops at a boundary. */
  cr_assert_eq(ckv_utf8_copy(out, sizeof(out), "ab\0cd", 5), 2);
  cr_assert_eq(ckv_utf8_copy(out, 5, "\xE2\x82\xAC\xE2\x82\xAC", 6), 3);
  cr_assert_str_eq(out, "\xE2\x82\xAC");
  cr_assert_eq(ckv_utf8_copy(out, 1, "abc", 3), 0);
  cr_assert_str_eq(out, "");
}

Test(utf8, copy_of_random_bytes_is_always_valid) {
  uint64_t x = 12345;
  char in[97], out[97 * 3 + 1];
  for (int round = 0; round < 20000; round++) {
    size_t len = (size_t)(x % 96) + 1;
    for (size_t i = 0; i < len; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      in[i] = (char)(x | 1); /* no NUL: the whole input is text */
    }
    size_t need = ckv_utf8_copy_size(in, len);
    cr_assert_leq(need, sizeof(out));
    size_t n = ckv_utf8_copy(out, sizeof(out), in, len);
    cr_assert_eq(n + 1, need);
    cr_assert(ckv_utf8_valid(out, n), "round %d: the repair is not valid UTF-8", round);
    if (ckv_utf8_valid(in, len)) cr_assert(n == len && memcmp(in, out, len) == 0);
  }
}
