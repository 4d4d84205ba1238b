/*
Copyright 2026 The Synapse Fleet Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package protocol

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"
)

// DefaultMaxFrame bounds one frame: a 32-sequence embedding reply of 4096 dimensions is
// about 0.5 MiB, so 16 MiB leaves room without letting a corrupt length allocate gigabytes.
const DefaultMaxFrame = 16 << 20

var (
	// ErrFrameTooLarge: the frame's length prefix exceeds the limit.
	ErrFrameTooLarge = errors.New("protocol fault: frame larger than the limit")
	// ErrTruncated: the stream ended inside a frame.
	ErrTruncated = errors.New("protocol fault: truncated frame")
	// ErrMalformed: the frame is not a valid message.
	ErrMalformed = errors.New("protocol fault: malformed frame")
)

// Reader reads frames.
type Reader struct {
	r   *bufio.Reader
	max int
	buf []byte
}

// NewReader reads frames of at most maxFrame bytes (DefaultMaxFrame if zero) from r.
func NewReader(r io.Reader, maxFrame int) *Reader {
	if maxFrame <= 0 {
		maxFrame = DefaultMaxFrame
	}
	return &Reader{r: bufio.NewReader(r), max: maxFrame}
}

// Read reads one frame into m. At a clean end of stream between frames it returns io.EOF.
func (r *Reader) Read(m proto.Message) error {
	b, err := r.ReadFrame()
	if err != nil {
		return err
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return nil
}

// ReadFrame reads one frame's bytes, undecoded: they are the Reader's and valid only until its
// next read. At a clean end of stream between frames it returns io.EOF.
func (r *Reader) ReadFrame() ([]byte, error) {
	n, err := binary.ReadUvarint(r.r)
	switch {
	case errors.Is(err, io.EOF):
		return nil, io.EOF
	case errors.Is(err, io.ErrUnexpectedEOF):
		return nil, ErrTruncated
	case err != nil:
		return nil, fmt.Errorf("%w: length prefix: %v", ErrMalformed, err)
	}
	if n > uint64(r.max) {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, r.max)
	}
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n)
	}
	b := r.buf[:n]
	if _, err := io.ReadFull(r.r, b); err != nil {
		return nil, fmt.Errorf("%w: %d of %d bytes", ErrTruncated, len(b), n)
	}
	return b, nil
}

// Writer writes frames.
type Writer struct {
	w   *bufio.Writer
	max int
	buf []byte
}

// NewWriter writes frames of at most maxFrame bytes (DefaultMaxFrame if zero) to w.
func NewWriter(w io.Writer, maxFrame int) *Writer {
	if maxFrame <= 0 {
		maxFrame = DefaultMaxFrame
	}
	return &Writer{w: bufio.NewWriter(w), max: maxFrame}
}

// Write writes m as one frame and flushes it.
func (w *Writer) Write(m proto.Message) error {
	b, err := proto.MarshalOptions{}.MarshalAppend(w.buf[:0], m)
	if err != nil {
		return fmt.Errorf("encoding a frame: %w", err)
	}
	w.buf = b
	return w.WriteFrame(b)
}

// WriteFrame writes b, an encoded message, as one frame and flushes it.
func (w *Writer) WriteFrame(b []byte) error {
	if len(b) > w.max {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, len(b), w.max)
	}
	var prefix [binary.MaxVarintLen64]byte
	if _, err := w.w.Write(prefix[:binary.PutUvarint(prefix[:], uint64(len(b)))]); err != nil {
		return err
	}
	if _, err := w.w.Write(b); err != nil {
		return err
	}
	return w.w.Flush()
}
