import { BlockList } from 'node:net'

/** A network and its prefix length, as node:net's BlockList takes them. */
export type Subnet = readonly [network: string, prefix: number, family: 'ipv4' | 'ipv6']

/** Whether an address of a family is in a fixed list of subnets. */
export interface AddressList {
  check(address: string, family: 'ipv4' | 'ipv6'): boolean
}

/**
 * A BlockList filled where it is made and only read afterwards: a module's
 * list of reserved networks stays a constant. It matches an IPv4-mapped IPv6
 * address (::ffff:127.0.0.1, ::ffff:7f00:1) against the IPv4 subnets.
 */
export function addressList(subnets: readonly Subnet[]): AddressList {
  const list = new BlockList()
  for (const [network, prefix, family] of subnets) list.addSubnet(network, prefix, family)
  return { check: (address, family) => list.check(address, family) }
}
