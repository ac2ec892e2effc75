/* utf8.h - UTF-8 for the text the daemon sends.
 *
 * proto3 `string` fields must hold valid UTF-8: standard clients (Python's
 * protobuf, Go, Java) refuse to decode a message whose string is not, so one
 * bad byte in an error text makes the whole reply unreadable.  Text reaches a
 * reply from printf formats that may cut a multi-byte character and from
 * bytes a client sent; this module checks such text, cuts it only at
 * character boundaries and replaces what is not UTF-8.  "Valid" is RFC 3629:
 * no overlong forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF. */
#ifndef CKV_DAEMON_UTF8_H
#define CKV_DAEMON_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* What replaces each byte that starts no valid sequence: U+FFFD. */
#define CKV_UTF8_REPLACEMENT "\xEF\xBF\xBD"

/* Length (1..4) of the valid UTF-8 sequence at s[0..len), or 0 when s[0]
 * starts none (a stray continuation byte, an overlong or surrogate form, a
 * sequence cut by `len`). */
size_t ckv_utf8_seq_len(const char *s, size_t len);

/* True when s[0..len) is valid UTF-8 (len = 0 is valid). */
bool ckv_utf8_valid(const char *s, size_t len);

/* The longest prefix of the NUL-terminated `s`, at most `max` bytes, that
 * does not end inside a valid multi-byte character: for "%.*s" in place of
 * "%.64s".  Bytes that start no valid sequence count as one character each
 * (ckv_utf8_copy replaces them). */
int ckv_utf8_prefix(const char *s, size_t max);

/* Cuts the NUL-terminated `s` in place before an incomplete character at its
 * end (what snprintf leaves when it truncates mid-character). */
void ckv_utf8_trim(char *s);

/* Bytes ckv_utf8_copy needs to copy s[0..len) whole, the NUL included. */
size_t ckv_utf8_copy_size(const char *s, size_t len);

/* Copies s[0..len) to out (NUL-terminated, at most `cap` bytes with the NUL;
 * cap >= 1) with every byte that starts no valid sequence replaced by
 * CKV_UTF8_REPLACEMENT and an embedded NUL ending the text.  Stops at a
 * character boundary when out is full.  Returns the bytes written, the NUL
 * excluded.  The result is always valid UTF-8. */
size_t ckv_utf8_copy(char *out, size_t cap, const char *s, size_t len);

#endif
