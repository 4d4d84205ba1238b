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

package localfleet

import (
	"fmt"
	"testing"
)

// A Mac's addresses follow from the order the fleet first sees it in, and stay its own when it
// stops and starts again; past the last host number the fleet says it has no room.
func TestOwnAddressesAreNumberedOnceAndKept(t *testing.T) {
	f := &Fleet{opts: Options{OwnAddresses: true}, hosts: map[string]byte{}}
	for _, name := range []string{"mac-a", "mac-b", "mac-a"} {
		if err := f.number(name); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ name, loopback, advertised string }{
		{"mac-a", "127.0.0.10", "198.51.100.10"},
		{"mac-b", "127.0.0.11", "198.51.100.11"},
		{"mac-unseen", "", ""},
	} {
		if got := f.loopbackOf(c.name); got != c.loopback {
			t.Errorf("%s listens on %q, want %q", c.name, got, c.loopback)
		}
		if got := f.AdvertisedAddress(c.name); got != c.advertised {
			t.Errorf("%s advertises %q, want %q", c.name, got, c.advertised)
		}
	}
	for i := len(f.hosts); i < lastHost-firstHost+1; i++ {
		if err := f.number(fmt.Sprintf("mac-%d", i)); err != nil {
			t.Fatalf("Mac %d: %v", i, err)
		}
	}
	if got := f.AdvertisedAddress(fmt.Sprintf("mac-%d", lastHost-firstHost)); got != "198.51.100.254" {
		t.Errorf("the last Mac advertises %q, want 198.51.100.254", got)
	}
	if err := f.number("mac-one-too-many"); err == nil {
		t.Errorf("a Mac past 198.51.100.254 was numbered %d", f.hosts["mac-one-too-many"])
	}
}

// Without OwnAddresses every Mac listens on 127.0.0.1 and advertises the machine's address.
func TestWithoutOwnAddressesEveryMacSharesTheMachinesAddresses(t *testing.T) {
	f := &Fleet{hosts: map[string]byte{}, ip: "203.0.113.7"}
	for _, name := range []string{"mac-a", "mac-b"} {
		if got := f.loopbackOf(name); got != "127.0.0.1" {
			t.Errorf("%s listens on %q", name, got)
		}
		if got := f.AdvertisedAddress(name); got != "203.0.113.7" {
			t.Errorf("%s advertises %q", name, got)
		}
	}
}
