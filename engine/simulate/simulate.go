// Package simulate implements the line protocol of `egret simulate`
// (spec section 7): one JSON object a line in, one JSON answer a line out.
package simulate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/egret-proxy/egret/engine"
)

// MaxLine bounds one input line.
const MaxLine = 1 << 20

// ErrBadLines is returned by Run when at least one line was not valid input.
var ErrBadLines = errors.New("simulate: some lines were not valid input")

type backoffIn struct {
	Kind   *string `json:"kind"`
	BaseMS *int64  `json:"base_ms"`
	MaxMS  *int64  `json:"max_ms"`
	PrevMS *int64  `json:"prev_ms"`
}

type lineIn struct {
	Attempt             *int       `json:"attempt"`
	MaxAttempts         *int       `json:"max_attempts"`
	BudgetTokens        *float64   `json:"budget_tokens"`
	Body                *string    `json:"body"`
	ResponseDelivered   *bool      `json:"response_delivered"`
	Draining            *bool      `json:"draining"`
	DeadlineRemainingMS *int64     `json:"deadline_remaining_ms"`
	MinAttemptMS        *int64     `json:"min_attempt_ms"`
	Failure             *string    `json:"failure"`
	Evidence            *string    `json:"evidence"`
	Idempotent          *bool      `json:"idempotent"`
	Status              *int       `json:"status"`
	RetryAfterMS        *int64     `json:"retry_after_ms"`
	TransientStatuses   []int      `json:"transient_statuses"`
	CanRefresh          *bool      `json:"can_refresh"`
	Refreshed           *bool      `json:"refreshed"`
	Backoff             *backoffIn `json:"backoff"`
}

// Answer is one output line.
type Answer struct {
	Decision string `json:"decision,omitempty"`
	Reason   string `json:"reason,omitempty"`
	DelayMS  *int64 `json:"delay_ms,omitempty"`
	Error    string `json:"error,omitempty"`
}

const maxMS = int64(math.MaxInt64 / int64(time.Millisecond))

func ms(field string, v int64, min int64) (time.Duration, error) {
	if v < min {
		return 0, fmt.Errorf("%s must be >= %d, got %d", field, min, v)
	}
	if v > maxMS || v < -maxMS {
		return 0, fmt.Errorf("%s is out of range: %d", field, v)
	}
	return time.Duration(v) * time.Millisecond, nil
}

func boolOr(p *bool) bool { return p != nil && *p }

// Parse decodes and validates one input line. Unknown fields, wrong types and
// out-of-range values are errors that name the field.
func Parse(line []byte) (engine.Input, error) {
	in := engine.Input{
		MaxAttempts:  engine.DefaultMaxAttempts,
		BudgetTokens: 10,
		MinAttempt:   engine.DefaultMinAttempt,
		Backoff:      engine.DefaultBackoff,
	}
	var l lineIn
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return in, fmt.Errorf("%w: %v", engine.ErrInvalidInput, err)
	}
	if dec.More() {
		return in, fmt.Errorf("%w: more than one JSON value on the line", engine.ErrInvalidInput)
	}
	if err := l.fill(&in); err != nil {
		return in, fmt.Errorf("%w: %v", engine.ErrInvalidInput, err)
	}
	return in, nil
}

func (l *lineIn) fill(in *engine.Input) error {
	var err error
	if l.Attempt == nil {
		return errors.New("attempt is required")
	}
	if in.Attempt = *l.Attempt; in.Attempt < 1 {
		return fmt.Errorf("attempt must be >= 1, got %d", in.Attempt)
	}
	if l.MaxAttempts != nil {
		if in.MaxAttempts = *l.MaxAttempts; in.MaxAttempts < 1 {
			return fmt.Errorf("max_attempts must be >= 1, got %d", in.MaxAttempts)
		}
	}
	if l.BudgetTokens != nil {
		if in.BudgetTokens = *l.BudgetTokens; in.BudgetTokens < 0 {
			return fmt.Errorf("budget_tokens must be >= 0, got %v", in.BudgetTokens)
		}
	}
	if l.Body != nil {
		if in.Body, err = engine.ParseBody(*l.Body); err != nil {
			return fmt.Errorf("body: %v", err)
		}
	}
	in.ResponseDelivered = boolOr(l.ResponseDelivered)
	in.Draining = boolOr(l.Draining)
	if l.DeadlineRemainingMS != nil {
		in.HasDeadline = true
		if in.DeadlineRemaining, err = ms("deadline_remaining_ms", *l.DeadlineRemainingMS, -maxMS); err != nil {
			return err
		}
	}
	if l.MinAttemptMS != nil {
		if in.MinAttempt, err = ms("min_attempt_ms", *l.MinAttemptMS, 0); err != nil {
			return err
		}
	}
	if l.Failure != nil {
		if in.Failure, err = engine.ParseCategory(*l.Failure); err != nil {
			return fmt.Errorf("failure: %v", err)
		}
	}
	if l.Status != nil {
		if in.Status = *l.Status; in.Status < 100 || in.Status > 599 {
			return fmt.Errorf("status must be 100-599, got %d", in.Status)
		}
	}
	if l.Evidence != nil {
		if in.Evidence, err = engine.ParseEvidence(*l.Evidence); err != nil {
			return fmt.Errorf("evidence: %v", err)
		}
	}
	switch {
	case in.Failure == engine.CategoryNone && in.Status == 0 && in.Evidence == engine.EvidenceUnknown:
		return errors.New("one of failure, status or evidence is required")
	case in.Failure == engine.CategoryNone && in.Status != 0 && in.Evidence != engine.EvidenceUnknown && in.Evidence != engine.ResponseReceived:
		return fmt.Errorf("evidence %s contradicts status %d without a failure", in.Evidence, in.Status)
	case in.Status == 0 && in.EffectiveEvidence() == engine.ResponseReceived:
		return errors.New("evidence response_received needs a status")
	}
	in.Idempotent = boolOr(l.Idempotent)
	if l.RetryAfterMS != nil {
		in.HasRetryAfter = true
		if in.RetryAfter, err = ms("retry_after_ms", *l.RetryAfterMS, 0); err != nil {
			return err
		}
	}
	for _, s := range l.TransientStatuses {
		if s < 100 || s > 599 {
			return fmt.Errorf("transient_statuses: %d is not an HTTP status", s)
		}
	}
	in.TransientStatuses = l.TransientStatuses
	in.CanRefresh = boolOr(l.CanRefresh)
	in.Refreshed = boolOr(l.Refreshed)
	if b := l.Backoff; b != nil {
		if b.Kind != nil {
			if in.Backoff.Kind, err = engine.ParseBackoffKind(*b.Kind); err != nil {
				return fmt.Errorf("backoff.kind %q: want full or decorrelated", *b.Kind)
			}
		}
		if b.BaseMS != nil {
			if in.Backoff.Base, err = ms("backoff.base_ms", *b.BaseMS, 0); err != nil {
				return err
			}
		}
		if b.MaxMS != nil {
			if in.Backoff.Max, err = ms("backoff.max_ms", *b.MaxMS, 0); err != nil {
				return err
			}
		}
		if b.PrevMS != nil {
			if in.PrevWait, err = ms("backoff.prev_ms", *b.PrevMS, 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// Decide answers one parsed input.
func Decide(in *engine.Input, rnd engine.Rand) Answer {
	r := engine.Decide(in, rnd)
	a := Answer{Decision: r.Decision.String(), Reason: r.Reason.String()}
	if r.Decision == engine.Retry {
		d := int64(r.Wait / time.Millisecond)
		a.DelayMS = &d
	}
	return a
}

// Run answers every line of r on w. Lines holding only white space are
// passed over. It returns ErrBadLines if any line was not valid input, after
// answering all of them; any other error is from reading or writing.
func Run(r io.Reader, w io.Writer, rnd engine.Rand) error {
	br := bufio.NewReaderSize(r, 64<<10)
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	bad := false
	for n := 1; ; n++ {
		line, rerr := readLine(br)
		if rerr != nil && rerr != io.EOF && !errors.Is(rerr, errLineTooLong) {
			return rerr
		}
		var a Answer
		switch {
		case errors.Is(rerr, errLineTooLong):
			a, bad = Answer{Error: fmt.Sprintf("line %d: longer than %d bytes", n, MaxLine)}, true
		case len(bytes.TrimSpace(line)) == 0:
			if rerr == io.EOF {
				return finish(bw, bad)
			}
			continue
		default:
			in, err := Parse(line)
			if err != nil {
				a, bad = Answer{Error: fmt.Sprintf("line %d: %v", n, err)}, true
			} else {
				a = Decide(&in, rnd)
			}
		}
		if err := enc.Encode(a); err != nil {
			return err
		}
		if br.Buffered() == 0 {
			// About to block on input: let an interactive caller see this.
			if err := bw.Flush(); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			return finish(bw, bad)
		}
	}
}

func finish(bw *bufio.Writer, bad bool) error {
	if err := bw.Flush(); err != nil {
		return err
	}
	if bad {
		return ErrBadLines
	}
	return nil
}

var errLineTooLong = errors.New("line too long")

// readLine reads one line without its end; a line over MaxLine is consumed
// to its end and reported as errLineTooLong.
func readLine(br *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(buf)+len(chunk) > MaxLine+1 {
			for err == bufio.ErrBufferFull {
				_, err = br.ReadSlice('\n')
			}
			if err != nil && err != io.EOF {
				return nil, err
			}
			return nil, errLineTooLong
		}
		buf = append(buf, chunk...)
		switch err {
		case bufio.ErrBufferFull:
			continue
		case nil:
			return bytes.TrimRight(buf, "\r\n"), nil
		default:
			return buf, err
		}
	}
}
