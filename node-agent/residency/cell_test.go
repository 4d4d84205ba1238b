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

package residency

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestACellIsNeverClosedUnderALease: the owner closes a cell for an eviction only while nobody
// holds a lease, in one atomic step with the leases, so a lease taken at the very instant the
// owner picked its victim either stops the close or fails itself. The core's candidate list
// already skips leased shapes; this is the guard for the lease that lands after that list.
func TestACellIsNeverClosedUnderALease(t *testing.T) {
	var epoch atomic.Int64
	c := &Cell{epoch: &epoch, Gen: &Gen{}}
	if ok, _ := c.lease(closedBit); !ok {
		t.Fatal("an open cell refused a lease")
	}
	if c.closeIfFree() {
		t.Fatal("a leased cell was closed for an eviction")
	}
	c.Release()
	if !c.closeIfFree() {
		t.Fatal("a free cell could not be closed")
	}
	if ok, _ := c.lease(closedBit); ok {
		t.Fatal("a closed cell was leased")
	}

	// Leases and a close race: whichever wins, a lease is never held on a closed cell.
	for range 200 {
		c := &Cell{epoch: &epoch, Gen: &Gen{}}
		var wg sync.WaitGroup
		var held atomic.Int32
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if ok, _ := c.lease(closedBit); ok {
					held.Add(1)
				}
			}()
		}
		closed := c.closeIfFree()
		wg.Wait()
		if closed && c.Leases() > 0 {
			t.Fatalf("the cell was closed for an eviction while %d leases hold it", c.Leases())
		}
		if int(held.Load()) != c.Leases() {
			t.Fatalf("%d leases granted, %d counted", held.Load(), c.Leases())
		}
	}
}
