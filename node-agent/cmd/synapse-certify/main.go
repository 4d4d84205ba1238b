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

// Command synapse-certify is the placement gate of backend certification: it validates a
// certify observation recorded by a node agent with certify observation on, and exits non-zero
// when a worker's inventory is missing or the inventories disagree with the independent
// admission count.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/ck-synapse/synapse-fleet/node-agent/certify"
)

func main() {
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: synapse-certify OBSERVATION.json (or - for standard input)\n")
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "synapse-certify:", err)
		os.Exit(1)
	}
	fmt.Println("placement gate passed")
}

func run(path string) error {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return err
	}
	obs, err := certify.Parse(data)
	if err != nil {
		return err
	}
	return certify.Validate(obs)
}
