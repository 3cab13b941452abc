package journal

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCorruptionTable damages a real journal in the ways a crash or a bad
// disk does, then checks, for each damage:
//   - what Open says: a recovered journal (torn or zero-filled tail: the
//     bytes cut are exactly the damaged ones and a .broken copy holds them),
//     or a *CorruptError naming the offset of the first damaged record and
//     how to repair it, with the file left byte for byte as it was;
//   - that following the repair advice (truncate at the named offset) gives
//     a journal that opens with the records before the damage;
//   - that appending then continues the sequence, and a reopen re-reads
//     every surviving record plus the new one, with no further recovery.
//
// The damage is placed from the file's real frame offsets, never from
// hard-coded positions, so the expected offsets follow the encoding.
func TestCorruptionTable(t *testing.T) {
	const records = 200 // about 13 KiB: room for a 4 KiB block strictly in the middle
	type damage struct {
		// apply damages data (a copy of a clean journal with offs the frame
		// starts) and returns the damaged bytes.
		apply func(t *testing.T, data []byte, offs []int64) []byte
		// corruptAt returns the offset Open must name in a CorruptError,
		// or -1 when Open must recover by cutting a tail.
		corruptAt func(offs []int64, data []byte) int64
		// survivors is how many records remain after recovery or repair.
		survivors func(offs []int64, data []byte) int
	}
	// frameAt returns the index of the frame holding byte pos.
	frameAt := func(offs []int64, pos int64) int {
		for i := len(offs) - 1; i >= 0; i-- {
			if offs[i] <= pos {
				return i
			}
		}
		t.Fatalf("position %d is in the file header", pos)
		return -1
	}
	const block = 4096
	cases := map[string]damage{
		"torn tail (last record cut in its payload)": {
			apply: func(t *testing.T, data []byte, offs []int64) []byte {
				last := offs[len(offs)-1]
				cut := last + (int64(len(data))-last)/2
				require.Greater(t, cut, last+frameHeaderLen, "the cut falls in the payload")
				return data[:cut]
			},
			corruptAt: func([]int64, []byte) int64 { return -1 },
			survivors: func(offs []int64, _ []byte) int { return len(offs) - 1 },
		},
		"torn tail (last record cut in its header)": {
			apply: func(t *testing.T, data []byte, offs []int64) []byte {
				return data[:offs[len(offs)-1]+7]
			},
			corruptAt: func([]int64, []byte) int64 { return -1 },
			survivors: func(offs []int64, _ []byte) int { return len(offs) - 1 },
		},
		"flipped byte in the payload of a middle record": {
			apply: func(t *testing.T, data []byte, offs []int64) []byte {
				mid := len(offs) / 2
				pos := offs[mid] + frameHeaderLen + 5
				data[pos] ^= 0x20
				return data
			},
			corruptAt: func(offs []int64, _ []byte) int64 { return offs[len(offs)/2] },
			survivors: func(offs []int64, _ []byte) int { return len(offs) / 2 },
		},
		"flipped byte in the length field of a middle record": {
			apply: func(t *testing.T, data []byte, offs []int64) []byte {
				mid := len(offs)/2 + 3
				data[offs[mid]+4] ^= 0x01 // the low byte of the payload length
				return data
			},
			corruptAt: func(offs []int64, _ []byte) int64 { return offs[len(offs)/2+3] },
			survivors: func(offs []int64, _ []byte) int { return len(offs)/2 + 3 },
		},
		"zeroed 4 KiB block in the middle": {
			apply: func(t *testing.T, data []byte, offs []int64) []byte {
				require.Greater(t, len(data), 3*block, "the journal must extend past the zeroed block")
				for i := block; i < 2*block; i++ {
					data[i] = 0
				}
				return data
			},
			corruptAt: func(offs []int64, data []byte) int64 { return offs[frameAt(offs, block)] },
			survivors: func(offs []int64, data []byte) int { return frameAt(offs, block) },
		},
		"zero-filled tail after the last record": {
			apply: func(t *testing.T, data []byte, offs []int64) []byte {
				return append(data, make([]byte, 2*block)...)
			},
			corruptAt: func([]int64, []byte) int64 { return -1 },
			survivors: func(offs []int64, _ []byte) int { return len(offs) },
		},
		"zero-filled tail over the end of the last record (preallocated, torn write)": {
			apply: func(t *testing.T, data []byte, offs []int64) []byte {
				last := offs[len(offs)-1]
				for i := last + frameHeaderLen; i < int64(len(data)); i++ {
					data[i] = 0
				}
				return append(data, make([]byte, block)...)
			},
			corruptAt: func([]int64, []byte) int64 { return -1 },
			survivors: func(offs []int64, _ []byte) int { return len(offs) - 1 },
		},
	}

	dir := t.TempDir()
	clean := writeJournal(t, filepath.Join(dir, "clean"), records)
	offs := frameOffsets(t, clean)
	require.Len(t, offs, records)

	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.log")
			damaged := c.apply(t, append([]byte{}, clean...), offs)
			require.NoError(t, os.WriteFile(path, damaged, 0o600))
			corruptAt := c.corruptAt(offs, clean)
			survivors := c.survivors(offs, clean)
			require.Less(t, survivors, records+1)

			j, info, err := Open(path, Options{})
			if corruptAt >= 0 {
				require.Nil(t, j)
				var ce *CorruptError
				require.ErrorAs(t, err, &ce)
				require.Equal(t, path, ce.Path)
				require.Equal(t, corruptAt, ce.Offset)
				msg := err.Error()
				require.Contains(t, msg, fmt.Sprintf("offset %d", corruptAt), "the error names the offset")
				require.Contains(t, msg, fmt.Sprintf("truncate -s %d %s", corruptAt, path), "the error says how to repair")
				// It also names the first intact record after the damage:
				// the first frame starting past the last changed byte.
				lastChanged := int64(-1)
				for i := range clean {
					if damaged[i] != clean[i] {
						lastChanged = int64(i)
					}
				}
				var follows int64 = -1
				for _, o := range offs {
					if o > lastChanged {
						follows = o
						break
					}
				}
				require.Greater(t, follows, corruptAt)
				require.Contains(t, ce.Reason, fmt.Sprintf("valid record follows at offset %d", follows))
				got, rerr := os.ReadFile(path)
				require.NoError(t, rerr)
				require.Equal(t, damaged, got, "a corrupt journal is left untouched")
				require.NoFileExists(t, path+".broken")
				// A second attempt says the same: nothing was half-repaired.
				_, _, err2 := Open(path, Options{})
				require.ErrorAs(t, err2, &ce)
				require.Equal(t, corruptAt, ce.Offset)

				// Follow the advice.
				require.NoError(t, os.Truncate(path, corruptAt))
				j, info, err = Open(path, Options{})
				require.NoError(t, err, "after truncating as advised")
				require.Equal(t, RecoverInfo{Records: survivors, LastSeq: uint64(survivors)}, info)
			} else {
				require.NoError(t, err)
				var end int64
				if survivors == len(offs) {
					end = int64(len(clean))
				} else {
					end = offs[survivors]
				}
				require.Equal(t, survivors, info.Records)
				require.Equal(t, uint64(survivors), info.LastSeq)
				require.Equal(t, int64(len(damaged))-end, info.TornBytes, "exactly the bytes after the last good record are cut")
				require.Equal(t, path+".broken", info.BrokenCopy)
				broken, rerr := os.ReadFile(info.BrokenCopy)
				require.NoError(t, rerr)
				require.Equal(t, damaged[end:], broken, "the .broken copy holds the cut bytes")
				st, serr := os.Stat(path)
				require.NoError(t, serr)
				require.Equal(t, end, st.Size())
				require.Equal(t, clean[:end], mustRead(t, path), "the records before the damage are byte for byte intact")
			}
			requireRecords(t, scanAll(t, j), survivors)

			// Append continues the sequence.
			extra := []byte(`{"op":"after-recovery"}`)
			seq, err := j.Append(extra)
			require.NoError(t, err)
			require.Equal(t, uint64(survivors+1), seq)
			seq, err = j.Append(payloadFor(survivors + 2))
			require.NoError(t, err)
			require.Equal(t, uint64(survivors+2), seq)
			require.NoError(t, j.Close())

			// Re-read: a clean open, every record in order.
			j, info, err = Open(path, Options{})
			require.NoError(t, err)
			defer j.Close()
			require.Equal(t, RecoverInfo{Records: survivors + 2, LastSeq: uint64(survivors + 2)}, info)
			recs := scanAll(t, j)
			require.Len(t, recs, survivors+2)
			requireRecords(t, recs[:survivors], survivors)
			require.Equal(t, uint64(survivors+1), recs[survivors].Seq)
			require.Equal(t, extra, recs[survivors].Payload)
			require.Equal(t, payloadFor(survivors+2), recs[survivors+1].Payload)
		})
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}
