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
	"errors"
	"fmt"
	"net/netip"
	"runtime"
)

// The addresses of a fleet of OwnAddresses. Mac k listens on 127.0.0.(firstHost+k): the whole
// of 127.0.0.0/8 is the host's loopback (RFC 1122, section 3.2.1.3), and Linux routes all of
// it to lo as soon as lo is up (`ip route show table local`: "local 127.0.0.0/8 dev lo"), so
// no setup is needed (macOS configures 127.0.0.1 alone: there the option is refused). It
// advertises 198.51.100.(firstHost+k), of TEST-NET-2, which RFC 5737 (sections 3 and 4) reserves
// for documentation: such addresses are never routed on the Internet, and nothing here listens
// on or calls them. The advertised address cannot be the loopback one: an EndpointSlice may
// not hold a loopback address (kubernetes/kubernetes: pkg/apis/discovery/validation/validation.go
// checks each address with pkg/apis/core/validation's ValidateEndpointIP, which refuses
// 127.0.0.0/8), nor does the controller publish one.
const (
	firstHost = 10
	lastHost  = 254
)

// advertisedRange is the range the Macs' advertised addresses are drawn from: the controller's
// --endpoint-cidrs.
var advertisedRange = netip.MustParsePrefix("198.51.100.0/24")

// shareAPort numbers the fleet's Macs and chooses the port they share: one below the ephemeral
// range, free on each one's loopback address, as stablePort chooses a Mac's own. A Mac first
// started later gets the next number and the same port, which was not checked on its address:
// if something holds it there, its agent exits and StartMac says so.
func (f *Fleet) shareAPort() error {
	if runtime.GOOS != "linux" {
		return errors.New("OwnAddresses needs Linux, which routes all of 127.0.0.0/8 to the loopback; this system configures 127.0.0.1 alone")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var hosts []string
	for _, m := range f.opts.Macs {
		if err := f.number(m.Name); err != nil {
			return err
		}
		hosts = append(hosts, f.loopbackOf(m.Name))
	}
	f.shared = stablePort(0, func(int) bool { return false }, hosts...)
	return nil
}

// number gives a Mac its host number the first time the fleet sees it (f.mu held); it keeps
// it when it stops and starts again.
func (f *Fleet) number(name string) error {
	if _, ok := f.hosts[name]; ok {
		return nil
	}
	h := firstHost + len(f.hosts)
	if h > lastHost {
		return fmt.Errorf("Mac %s: a fleet of OwnAddresses has addresses for %d Macs", name, lastHost-firstHost+1)
	}
	f.hosts[name] = byte(h)
	return nil
}

// loopbackOf is the address a Mac listens on (f.mu held): its own, or 127.0.0.1 for every Mac
// of a fleet without OwnAddresses. It is "" for a Mac the fleet has not seen.
func (f *Fleet) loopbackOf(name string) string {
	if !f.opts.OwnAddresses {
		return "127.0.0.1"
	}
	return hostIn(netip.MustParsePrefix("127.0.0.0/24"), f.hosts[name])
}

// advertisedOf is the address a Mac advertises (f.mu held): its own, or the machine's for
// every Mac of a fleet without OwnAddresses. It is "" for a Mac the fleet has not seen.
func (f *Fleet) advertisedOf(name string) string {
	if !f.opts.OwnAddresses {
		return f.ip
	}
	return hostIn(advertisedRange, f.hosts[name])
}

// hostIn is the address of host number h in a /24 ("" for 0, no Mac's).
func hostIn(p netip.Prefix, h byte) string {
	if h == 0 {
		return ""
	}
	a := p.Addr().As4()
	a[3] = h
	return netip.AddrFrom4(a).String()
}

// AdvertisedAddress is the address a Mac advertises (--advertise-address): its MacNode reports
// it, its serving certificate names it and its lanes' EndpointSlices list it. Under
// OwnAddresses it is the Mac's own, in 198.51.100.0/24; otherwise every Mac's is the machine's
// first non-loopback IPv4 address, or 127.0.0.1 when it has none (and then no EndpointSlice
// lists them). Nothing listens on it: callers use URL.
func (f *Fleet) AdvertisedAddress(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.advertisedOf(name)
}
