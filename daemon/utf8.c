/* utf8.c - checking, cutting and repairing UTF-8 text (see utf8.h). */
#include "daemon/utf8.h"

#include <stdint.h>
#include <string.h>

size_t ckv_utf8_seq_len(const char *str, size_t len) {
  const uint8_t *s = (const uint8_t *)str;
  if (len == 0) return 0;
  uint8_t c = s[0];
  if (c < 0x80) return 1;
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0; /* overlong below U+0800 */
    if (c == 0xED) hi = 0x9F; /* surrogates U+D800..U+DFFF */
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90; /* overlong below U+10000 */
    if (c == 0xF4) hi = 0x8F; /* above U+10FFFF */
  } else {
    return 0; /* continuation byte, C0/C1 (overlong ASCII), F5..FF */
  }
  if (len < n || s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < n; i++)
    if ((s[i] & 0xC0) != 0x80) return 0;
  return n;
}

bool ckv_utf8_valid(const char *s, size_t len) {
  for (size_t i = 0; i < len;) {
    if ((uint8_t)s[i] < 0x80) { /* ASCII runs are the common case */
      i++;
      continue;
    }
    size_t n = ckv_utf8_seq_len(s + i, len - i);
    if (!n) return false;
    i += n;
  }
  return true;
}

int ckv_utf8_prefix(const char *s, size_t max) {
  size_t len = strnlen(s, max), i = 0;
  while (i < len) {
    size_t n = ckv_utf8_seq_len(s + i, len - i);
    if (!n) {
      /* Either an invalid byte (one character for the repair) or a valid
       * character that `max` cuts: stop before the latter. */
      if (ckv_utf8_seq_len(s + i, strnlen(s + i, 4)) > len - i) break;
      n = 1;
    }
    i += n;
  }
  return (int)(i < (size_t)INT32_MAX ? i : INT32_MAX);
}

void ckv_utf8_trim(char *s) {
  size_t len = strlen(s);
  /* An incomplete character is at most 3 bytes: a lead byte and up to two
   * continuation bytes, all within the last 3 bytes. */
  for (size_t back = 1; back <= 3 && back <= len; back++) {
    uint8_t c = (uint8_t)s[len - back];
    if ((c & 0xC0) == 0x80) continue; /* continuation: look further back */
    if (c >= 0xC2 && c <= 0xF4) {
      size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      if (want > back) s[len - back] = 0;
    }
    return;
  }
}

size_t ckv_utf8_copy_size(const char *s, size_t len) {
  size_t need = 1;
  for (size_t i = 0; i < len && s[i];) {
    size_t n = ckv_utf8_seq_len(s + i, len - i);
    need += n ? n : sizeof(CKV_UTF8_REPLACEMENT) - 1;
    i += n ? n : 1;
  }
  return need;
}

size_t ckv_utf8_copy(char *out, size_t cap, const char *s, size_t len) {
  size_t o = 0;
  for (size_t i = 0; i < len && s[i];) {
    size_t n = ckv_utf8_seq_len(s + i, len - i);
    const char *piece = n ? s + i : CKV_UTF8_REPLACEMENT;
    size_t plen = n ? n : sizeof(CKV_UTF8_REPLACEMENT) - 1;
    if (plen > cap - 1 - o) break; /* full: stop at a character boundary */
    memcpy(out + o, piece, plen);
    o += plen;
    i += n ? n : 1;
  }
  out[o] = 0;
  return o;
}
