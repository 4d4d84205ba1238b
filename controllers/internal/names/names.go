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

// Package names lists names in a condition's or an event's message, bounded: a fleet may name
// hundreds of lanes where a message has room for a few.
package names

import (
	"fmt"
	"strings"
)

// Shown is how many names a message lists before it counts the rest.
const Shown = 5

// Some lists the first Shown names, and how many more there are.
func Some(names []string) string {
	if len(names) <= Shown {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:Shown], ", "), len(names)-Shown)
}
