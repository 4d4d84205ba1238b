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

package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stepPrefix starts the line a ladder process writes to stderr before each framework call.
const stepPrefix = "step: "

// announce writes a step line; stderr is unbuffered, so the line is out before the call.
func announce(w io.Writer) func(step string) {
	var mu sync.Mutex
	return func(step string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintln(w, stepPrefix+step)
	}
}

// traced runs cmd, copying its stderr to echo and remembering the last step it announced.
// An Objective-C exception or a bad call kills a process outright (it cannot be caught from
// Go), so the process running the framework is always a child of one that is not.
func traced(cmd *exec.Cmd, echo io.Writer) (lastStep string, runErr error) {
	pipe, err := cmd.StderrPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	sc := bufio.NewScanner(pipe)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(echo, line)
		if step, ok := strings.CutPrefix(line, stepPrefix); ok {
			lastStep = step
		}
	}
	return lastStep, cmd.Wait()
}

// supervise runs the ladder as cmd, a child that writes its report to path after every check,
// and makes sure a report is there however the child ends: a child that dies before finishing
// leaves its partial report (or a new one) marked with the signal or exit status, the stage it
// was in and its last framework call. started and logCommand fill a report the child never
// wrote.
func supervise(cmd *exec.Cmd, path string, echo io.Writer, started time.Time, logCommand string) (*Report, error) {
	lastStep, runErr := traced(cmd, echo)
	rep, err := readReport(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		rep = &Report{Schema: ReportSchema, Started: started, LogCommand: logCommand}
	case err != nil:
		return nil, fmt.Errorf("the ladder's report: %w", err)
	}
	if rep.Finished {
		return rep, nil
	}
	crash := &Crash{LastStep: lastStep, ExitCode: -1}
	var exit *exec.ExitError
	switch {
	case errors.As(runErr, &exit):
		crash.ExitCode = exit.ExitCode()
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			crash.Signal = ws.Signal().String()
		}
	case runErr != nil:
		return nil, fmt.Errorf("running the ladder: %w", runErr)
	default:
		crash.ExitCode = 0
	}
	for i := range rep.Stages {
		if s := &rep.Stages[i]; s.Status == Running {
			crash.Stage = s.Name
			s.Status = Failed
			s.Error = &StageError{Call: lastStep, Message: fmt.Sprintf("the ladder process died in this stage (%s), during %q", crashHow(crash), lastStep)}
		}
	}
	rep.Crash, rep.Passed = crash, false
	if err := writeReport(path, rep); err != nil {
		return rep, fmt.Errorf("writing the report: %w", err)
	}
	return rep, nil
}

func crashHow(c *Crash) string {
	if c.Signal != "" {
		return c.Signal
	}
	return fmt.Sprintf("exit status %d", c.ExitCode)
}

// childArgs are this process's arguments with the flag that makes the child run the ladder.
func childArgs() []string {
	return append([]string{"--child"}, os.Args[1:]...)
}
