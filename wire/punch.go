package wire

// OpPunch's Flags: fallocate's mode bits (linux/falloc.h), so that they
// pass through as they come.
const (
	PunchKeepSize  uint32 = 0x01 // the size does not grow
	PunchHole      uint32 = 0x02 // deallocate: needs PunchKeepSize, as Linux
	PunchZeroRange uint32 = 0x10 // zero, growing the size unless PunchKeepSize
)

// MaxPunch bounds the bytes of a file's data one OpPunch may zero, which
// keeps the server's transaction small; a client cuts a longer range into
// pieces (bytes past the file's end do not count).
const MaxPunch = 16 << 20
