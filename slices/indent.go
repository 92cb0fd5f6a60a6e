package slices

import "bytes"

// appendIndent appends src, compact JSON as json.Marshal writes it, to dst
// indented as json.Indent(dst, src, prefix, indent) would: a new line for
// each element and member, ": " after keys, empty objects and arrays kept
// as {} and []. json.Indent runs its validating scanner over every byte,
// an eighth of `carve discover`'s CPU on a large node; src here is
// json.Marshal's own output, valid and without spaces, so only strings
// need to be told apart. TestAppendIndentAsJSONIndent holds it to
// json.Indent.
func appendIndent(dst, src []byte, prefix, indent string) []byte {
	depth := 0
	open := false // an object or array just opened, maybe empty
	newline := func() {
		dst = append(dst, '\n')
		dst = append(dst, prefix...)
		for range depth {
			dst = append(dst, indent...)
		}
	}
	for i := 0; i < len(src); i++ {
		c := src[i]
		if open && c != '}' && c != ']' {
			open = false
			depth++
			newline()
		}
		switch c {
		case '"':
			// Copy the string whole: up to its closing quote, past
			// escaped characters.
			j := i + 1
			for j < len(src) {
				k := bytes.IndexAny(src[j:], `"\`)
				if k < 0 {
					j = len(src)
					break
				}
				j += k
				if src[j] == '"' {
					break
				}
				j += 2
			}
			end := min(j+1, len(src))
			dst = append(dst, src[i:end]...)
			i = end - 1
		case '{', '[':
			dst = append(dst, c)
			open = true
		case '}', ']':
			if open {
				open = false // empty: {} or []
			} else {
				depth--
				newline()
			}
			dst = append(dst, c)
		case ',':
			dst = append(dst, c)
			newline()
		case ':':
			dst = append(dst, ':', ' ')
		default:
			dst = append(dst, c)
		}
	}
	return dst
}
